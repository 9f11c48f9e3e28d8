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
