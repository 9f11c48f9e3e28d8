"""`muster checkpoint ...`."""

from __future__ import annotations

import typer

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client

app = typer.Typer(help="List trials' checkpoints.", no_args_is_help=True)


@app.command("list")
def list_(
    trial_id: int, as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List a trial's checkpoints: step, attempt, size, and whether each is intact."""
    with client(home, url) as c:
        rows = c.list_checkpoints(trial_id)
    render.print_json(rows) if as_json else render.console.print(render.checkpoints_table(rows))
