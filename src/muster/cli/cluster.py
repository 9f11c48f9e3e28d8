"""`muster cluster status`: slots, queue and the disk guard of the server."""

from __future__ import annotations

import typer
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.sizes import format_size

app = typer.Typer(help="The server's resources.", no_args_is_help=True)


@app.command()
def status(as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Show slots in use, queued and SUSPECT trials, and free disk against the guard."""
    with client(home, url) as c:
        info = c.cluster_status()
    if as_json:
        render.print_json(info)
        return
    table = Table("Slots in use", "Queued", "Suspect", "Free disk", "Disk guard")
    guard = "[green]ok[/]" if info["disk_ok"] else "[red]launches wait[/]"
    table.add_row(f"{info['slots_in_use']} / {info['slots']}", str(info["queued"]),
                  str(info["suspect"]), format_size(info["free_disk_bytes"]), guard)
    render.console.print(table)
    render.console.print(info["disk_message"], markup=False)
