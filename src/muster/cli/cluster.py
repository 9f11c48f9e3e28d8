"""`muster cluster status`: slots, GPUs, the queue, trials and disk of the server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.cli.quota import quotas_table
from muster.sizes import format_size

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="The server's resources.", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)
node_app = typer.Typer(help="The cluster's nodes.", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)
app.add_typer(node_app, name="node")


@app.command()
def status(as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Show slots in use, the GPUs and who holds them, trials by state, the quotas and
    what is in use of each, and free disk."""
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
    render.console.print(f"trials: {_trial_counts(info['trial_counts'])}", markup=False)
    if info.get("quotas"):
        render.console.print(quotas_table(info["quotas"]))
    for node in info.get("nodes", []):
        render.console.print(_node_line(node), markup=False)
    envs = info["environments"]
    render.console.print(f"environments: {envs['count']} built, {format_size(envs['bytes'])} "
                         "(muster env list)", markup=False)
    render.console.print(f"runtime base: {info['runtime_base']['message']}", markup=False)
    render.console.print(info["gpu_note"], markup=False)
    if info["gpus"]:
        render.console.print(gpus_table(info["gpus"]))
    for gpu in info["gpus"]:
        if gpu["memory_error"]:
            render.console.print(f"GPU {gpu['index']}: {gpu['memory_error']}", markup=False)
    render.console.print(filesystems_table(info["filesystems"]))


@node_app.command("release")
def release(node: str = typer.Argument(..., help="the node's id, as `cluster status` shows it"),
            home: HomeOption = None, url: UrlOption = None) -> None:
    """Return a node the bad-node circuit breaker quarantined to the pool (admins)."""
    with client(home, url) as c:
        c.release_node(node)
    render.console.print(f"node {node} is back in the pool: new replicas may be placed there",
                         markup=False)


def _node_line(node: api.NodeView) -> str:
    free = ("" if node.get("cpus_free") is None
            else f" ({node['cpus_free']:g} CPUs, {node['gpus_free']:g} GPUs free)")
    line = (f"node {node['id']} ({node['address']}): "
            f"{'alive' if node['alive'] else 'not alive'}, {node['cpus']} CPUs, "
            f"{node['gpus']} GPUs{free}")
    if node.get("quarantined"):
        line += f"; QUARANTINED: {node['quarantine_reason']}"
    running = [f"trial {r['trial_id']} rank {r['rank']}" for r in node.get("replicas", [])]
    if running:
        line += "; runs " + ", ".join(running)
    return line


def _trial_counts(counts: dict[str, int]) -> str:
    shown = [f"{n} {state}" for state, n in counts.items() if n]
    return ", ".join(shown) or "none"


def gpus_table(gpus: list[api.GpuView]) -> Table:
    table = Table("GPU", "Name", "Type", "Memory used", "State", "Trial")
    for gpu in gpus:
        total = format_size(gpu["memory_total_bytes"])
        used = gpu["memory_used_bytes"]
        memory = f"{format_size(used) if used is not None else '[red]unreadable[/]'} / {total}"
        trial = "-" if gpu["trial_id"] is None else str(gpu["trial_id"])
        table.add_row(str(gpu["index"]), escape(gpu["name"]), escape(gpu["type"]), memory,
                      gpu["state"], trial)
    return table


def filesystems_table(filesystems: list[api.FilesystemView]) -> Table:
    table = Table("File system of", "Free", "Total")
    for fs in filesystems:
        table.add_row(escape(", ".join(fs["paths"])), format_size(fs["free_bytes"]),
                      format_size(fs["total_bytes"]))
    return table
