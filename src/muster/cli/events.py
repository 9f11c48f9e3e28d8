"""`muster events`: the audit trail, who did what."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client


def events(
    experiment: Annotated[int | None, typer.Option(help="only this experiment's")] = None,
    trial: Annotated[int | None, typer.Option(help="only this trial's")] = None,
    user: Annotated[str | None, typer.Option(
        help="only what this user did (or system:supervisor, system:searcher)")] = None,
    tail: Annotated[int, typer.Option(help="the last N events")] = 100,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Show the audit trail: every state change and decision, with who made it."""
    with client(home, url) as c:
        rows = c.list_events(experiment_id=experiment, trial_id=trial, user=user, tail=tail)
    if as_json:
        render.print_json(rows)
        return
    table = Table("ID", "Time", "Actor", "Kind", "About", "Message")
    for event in rows:
        about = f"{event['entity']} {event['entity_id']}"
        if event["to_state"]:
            about += f": {event['from_state'] or '-'} → {event['to_state']}"
        table.add_row(str(event["id"]), render.when(event["at"]), escape(event["actor"]),
                      escape(event["kind"]), escape(about), escape(event["message"] or ""))
    render.console.print(table)
