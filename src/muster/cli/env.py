"""`muster env list | logs | prune`: the Python environments muster builds for trials."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Column, Table

from muster.cli import render
from muster.cli.options import (
    HomeOption,
    JsonOption,
    LimitOption,
    OffsetOption,
    UrlOption,
    client,
)
from muster.sizes import format_size

app = typer.Typer(help="Python environments built for trials.", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)

_SHOWN_PACKAGES = 4


@app.command("list")
def list_(offset: OffsetOption = 0, limit: LimitOption = None, as_json: JsonOption = False,
          home: HomeOption = None, url: UrlOption = None) -> None:
    """Show the environments by hash, 1,000 at a time (--offset, --limit): hash, base
    interpreter, packages, size, last use, trials."""
    with client(home, url) as c:
        found = c.list_environments(offset=offset, limit=limit)
    command = "muster env list" + (f" --limit {limit}" if limit else "")
    if as_json:
        render.print_json(found)
        render.print_page_line("environments", found, command, as_json=True)
        return
    if not found.total:
        render.console.print("no environments (an experiment with environment.pip, "
                             "requirements or setup gets one)", markup=False)
        return
    table = Table(Column("Hash", no_wrap=True), "State", "Python", "Packages", "Size",
                  "Last used", "Trials")
    for env in found:
        packages = env["packages"][:_SHOWN_PACKAGES]
        more = len(env["packages"]) - len(packages)
        table.add_row(
            env["hash"], render.state(env["state"]),
            escape(env["python"]) + ("" if env["inherit"] else " (clean)"),
            escape(", ".join(packages) + (f", +{more}" if more > 0 else "")) or "-",
            format_size(env["size_bytes"]) if env["size_bytes"] is not None else "-",
            _ago(env["last_used"]), _trials(env["trials"], env["trials_total"]))
    if found:
        render.console.print(table)
    for env in found:
        if env["message"]:
            render.console.print(f"{env['hash']}: {env['message']}", markup=False)
    render.print_page_line("environments", found, command, as_json=False)


@app.command()
def logs(env_hash: Annotated[str, typer.Argument(metavar="HASH",
                                                 help="the hash, or its first 4+ digits")],
         home: HomeOption = None, url: UrlOption = None) -> None:
    """Print an environment's build log (what uv and the setup commands said)."""
    with client(home, url) as c:
        offset = 0
        while True:
            _key, data = c.environment_log(env_hash, offset)
            if not data:
                break
            sys.stdout.buffer.write(data)
            offset += len(data)
    sys.stdout.flush()


@app.command()
def prune(older_than: Annotated[str, typer.Option(
              "--older-than", help="remove those unused for this long (7d, 12h, 0s)")] = "7d",
          as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Remove environments unused for a while; never one a trial not ended needs."""
    with client(home, url) as c:
        result = c.prune_environments(older_than)
    if as_json:
        render.print_json(result)
        return
    removed, kept = result["removed"], result["kept_in_use"]
    render.console.print(f"removed {len(removed)} environment(s), freed "
                         f"{format_size(result['freed_bytes'])}"
                         + (f": {', '.join(removed)}" if removed else ""), markup=False)
    if kept:
        render.console.print(f"kept, in use by trials that have not ended: {', '.join(kept)}",
                             markup=False)


def _ago(at: float | None) -> str:
    if at is None:
        return "-"
    seconds = max(0.0, time.time() - at)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _trials(ids: list[Any], total: int) -> str:
    """The first six of the trials listed (the server lists the newest 100), and how many
    others use the environment (`total`: all of them)."""
    shown = ids[:6]
    return ", ".join(map(str, shown)) + (f", +{total - len(shown)}" if total > len(shown)
                                         else "") or "-"
