"""`muster usage`: slot-hours and GPU-hours, what they were spent on, and goodput."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.states import UsageBy

if TYPE_CHECKING:
    from muster import api


def usage(
    by: Annotated[UsageBy, typer.Option(help="group by user, experiment or label (an "
                                             "experiment counts under each of its labels)")
                  ] = UsageBy.USER,
    since: Annotated[str, typer.Option(help="how far back: 30d, 12h, 90m (at most 400d)")
                     ] = "30d",
    user: Annotated[str | None, typer.Option(help="only this user's experiments")] = None,
    everyone: Annotated[bool, typer.Option(
        "--all", help="everyone's experiments (a user's default is its own)")] = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Show slot-hours and GPU-hours: productive, lost, stalled, idle, queued, and goodput."""
    with client(home, url) as c:
        report = c.usage(by=by.value, since=since, user=user, everyone=everyone)
    if as_json:
        render.print_json(report["rows"])
        return
    render.console.print(_table(report))
    render.console.print(_caption(report), markup=False)


def _table(report: api.UsageReport) -> Table:
    table = Table(report["by"].capitalize())
    for heading in ("Slot-h", "GPU-h", "Productive", "Lost", "Stalled", "Idle", "Running",
                    "Queued", "Goodput"):
        table.add_column(heading, justify="right")
    for row in report["rows"]:
        label = row["key"] if row["name"] == row["key"] else f"{row['key']} {row['name']}"
        table.add_row(escape(label), *_numbers(row))
    table.add_section()
    table.add_row("total", *_numbers(report["total"]), style="bold")
    return table


def _numbers(row: api.UsageRow) -> list[str]:
    hours = (row["slot_hours"], row["gpu_hours"], row["productive_hours"], row["lost_hours"],
             row["stalled_hours"], row["idle_hours"], row["running_hours"], row["queued_hours"])
    goodput = row["goodput"]
    return [f"{value:.2f}" for value in hours] + ["-" if goodput is None else f"{goodput:.1%}"]


def _caption(report: api.UsageReport) -> str:
    whose = f"{report['owner']}'s experiments" if report["owner"] else "everyone's experiments"
    more = f"; {report['more_rows']} smaller groups not listed" if report["more_rows"] else ""
    return (f"{whose}, {render.when(report['since'])} to {render.when(report['until'])}; "
            "hours of slots (one a replica), queued in trial-hours; goodput = productive / "
            f"(productive + lost + stalled + idle){more}")
