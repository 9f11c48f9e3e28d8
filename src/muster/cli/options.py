"""Options shared by several commands, and how they become a client."""

from __future__ import annotations

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
