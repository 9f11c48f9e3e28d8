"""`muster gc runs`: what the cluster config's retention removes, planned or done."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.states import RetentionItem

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="Remove what the cluster config's retention says is past keeping.",
                  no_args_is_help=True, rich_markup_mode=None, add_completion=False)


# The callback keeps `gc` a group while it has one command (`muster gc runs`, room for
# more); without it Typer would make `muster gc` that command.
@app.callback()
def _group() -> None:
    """Remove what the cluster config's retention says is past keeping."""


@app.command()
def runs(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan with sizes, "
                                                            "remove nothing")] = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Remove the logs, run directories, checkpoints not registered and artifacts of
    experiments that ended longer ago than the cluster config's retention allows (admins),
    printing each with its size and rule, and what stays and why; each trial's removal is
    recorded as an event first. --dry-run only prints the plan."""
    with client(home, url) as c:
        plan = c.sweep_runs(dry_run)
    if as_json:
        render.print_json(plan)
        return
    if plan["lines"]:
        render.console.print(_lines_table(plan))
    if plan["kept"]:
        render.console.print(_kept_table(plan))
    render.console.print(plan["message"], markup=False)


def _lines_table(plan: api.RetentionPlan) -> Table:
    title = "Past the retention rules" + (" (dry run: nothing is removed)"
                                          if plan["dry_run"] else "")
    table = Table("Experiment", "Trial", "What", title=title)
    for heading in ("Size", "Files", "Ended", "Past"):  # whole, however narrow the terminal
        table.add_column(heading, no_wrap=True, justify="right" if heading != "Past" else "left")
    for line in plan["lines"]:
        table.add_row(escape(f"{line['experiment_id']} {line['experiment_name']}"),
                      str(line["trial_id"]), escape(_what(line)), _size(line),
                      f"{line['files']:,}", _day(line["ended_at"]),
                      line["rule"].removeprefix("retention."))
    table.add_section()
    table.add_row("total" if plan["complete"] else "total (the first lines; more follow)",
                  "", "", render.size(plan["total_bytes"]), "", "", "", style="bold")
    return table


def _what(line: api.RetentionLine) -> str:
    what = RetentionItem(line["what"])
    return what.value if line["name"] is None else f"{what.value} {line['name']}"


def _day(ts: float) -> str:
    """When its experiment ended, to the day: the rules count days."""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d")


def _size(line: api.RetentionLine) -> str:
    return ("≥ " if line["at_least"] else "") + render.size(line["bytes"])


def _kept(plan: api.RetentionPlan) -> list[tuple[str, str, str]]:
    return [(f"{k['experiment_id']} {k['experiment_name']}",
             "-" if k["trial_id"] is None else str(k["trial_id"]), k["why"])
            for k in plan["kept"]]


def _kept_table(plan: api.RetentionPlan) -> Table:
    more = f" (and {plan['more_kept']:,} more)" if plan["more_kept"] else ""
    table = Table("Experiment", "Trial", "Why", title=f"Past a rule, kept{more}")
    for experiment, trial, why in _kept(plan):
        table.add_row(escape(experiment), trial, escape(why))
    return table
