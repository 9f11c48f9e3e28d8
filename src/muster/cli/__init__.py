"""The `muster` command line: thin Typer commands over `muster.client`."""

from __future__ import annotations

import sys

import typer

from muster.cli import (
    checkpoint,
    cluster,
    env,
    events,
    experiment,
    job,
    server,
    tokens,
    trial,
    users,
)
from muster.errors import MusterError

app = typer.Typer(
    name="muster",
    help="Run training experiments as supervised processes that never report a false success.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("up")(server.up)
app.command("down")(server.down)
app.add_typer(experiment.app, name="experiment")
app.add_typer(experiment.app, name="e", hidden=True)
app.add_typer(trial.app, name="trial")
app.add_typer(trial.app, name="t", hidden=True)
app.add_typer(checkpoint.app, name="checkpoint")
app.add_typer(cluster.app, name="cluster")
app.add_typer(job.app, name="job")
app.add_typer(env.app, name="env")
app.add_typer(users.app, name="user")
app.add_typer(tokens.app, name="token")
app.command("login")(tokens.login)
app.command("logout")(tokens.logout)
app.command("whoami")(users.whoami)
app.command("events")(events.events)


def main() -> None:
    """Console entry point: MusterErrors become one readable line and exit status 1."""
    try:
        app()
    except MusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
