"""`muster trial ...` (alias `muster t`)."""

from __future__ import annotations

import codecs
import sys
from typing import Annotated

import typer

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client

app = typer.Typer(help="Describe trials and read their logs.", no_args_is_help=True)


@app.command()
def describe(
    trial_id: int, as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Show a trial: its attempts, how each replica ended, and its event history."""
    with client(home, url) as c:
        trial = c.get_trial(trial_id)
    if as_json:
        render.print_json(trial)
        return
    render.console.print(f"Trial {trial['id']} (experiment {trial['experiment_id']}): "
                         f"{render.state(trial['state'])}  restarts: {trial['restarts']}")
    if trial["message"]:
        render.console.print(trial["message"], markup=False)
    render.console.print(render.attempts_table(trial))
    for line in render.ended_replicas(trial):
        render.console.print(f"  {line}", markup=False)


@app.command()
def logs(
    trial_id: int,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream until the trial ends")]
    = False,
    tail: Annotated[int | None, typer.Option(help="only the last N lines")] = None,
    attempt: Annotated[int | None, typer.Option(help="attempt number (default: latest)")]
    = None,
    rank: Annotated[int, typer.Option(help="replica rank")] = 0,
    home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Write the trial's log to stdout (decoded as UTF-8 with replacement), nothing else."""
    out = sys.stdout
    # Incremental: a character split across two chunks is decoded whole, not replaced.
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    with client(home, url) as c:
        if follow:
            for chunk in c.follow_logs(trial_id, attempt=attempt, rank=rank, tail=tail):
                out.write(decode(chunk))
                out.flush()
            out.write(decode(b"", final=True))
            return
        offset = 0
        while True:
            piece = c.read_logs(trial_id, attempt=attempt, rank=rank, offset=offset, tail=tail)
            out.write(decode(piece.data))
            if not piece.data:
                break
            # A tail longer than one read goes on from where the first read ended.
            attempt, offset, tail = piece.attempt, piece.next_offset, None
    out.write(decode(b"", final=True))
    out.flush()
