"""Options shared by several commands, and how they become a client."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from muster.client import Client
from muster.home import Home

HomeOption = Annotated[
    str | None,
    typer.Option("--home", envvar="MUSTER_HOME", help="muster home (default ~/.muster)"),
]
UrlOption = Annotated[
    str | None, typer.Option("--url", envvar="MUSTER_URL", help="server URL")
]
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable JSON output")]
# A list the server pages: the page these show, and the line after it says how to see more.
OffsetOption = Annotated[int, typer.Option(min=0, help="show the list from this row (from 0)")]
LimitOption = Annotated[int | None, typer.Option(
    min=1, max=1000, help="show at most this many rows (default and most: 1,000)")]


def client(home: str | None, url: str | None) -> Client:
    return Client(url=url, home=Home.resolve(home))


INTERRUPTED = 130  # what a shell reports for a command ended by Ctrl-C (128 + SIGINT)


@contextmanager
def stopped_following(what: str, experiment_id: int) -> Iterator[None]:
    """Ctrl-C while following: say that the run goes on and how to stop it; exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"\nstopped following; {what} keeps running (muster experiment kill "
              f"{experiment_id})", file=sys.stderr, flush=True)
        raise typer.Exit(INTERRUPTED) from None
