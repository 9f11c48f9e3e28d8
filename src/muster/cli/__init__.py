"""The `muster` command line: thin Typer commands over `muster.client`.

Start-up is part of the interface: `muster --help` must answer in well under a second on a
slow machine, so no subcommand's module is imported until that subcommand runs. The
top-level group lists its commands from `COMMANDS` below (name, module, short help) and
imports a module the first time `click` asks for one of its commands; a command group makes
each of its subcommands only when it is looked up. Help is plain text (Typer's rich
formatting imports rich's Markdown for every `--help`).
"""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

import typer
from typer.core import TyperGroup
from typer.models import CommandInfo

from muster.errors import MusterError


@dataclass(frozen=True)
class Entry:
    """A top-level command, loaded on first use: `attribute` of `muster.cli.<module>` is a
    Typer app (a command group) or a function (one command)."""

    module: str
    attribute: str
    help: str
    hidden: bool = False


_TRIAL_HELP = ("Describe trials, read their logs and metrics, dump their stacks, review them; "
               "kill, pause, activate or restart one.")

# The order is the order `muster --help` lists them in. `help` is each command's short
# help as its module states it (tests/cli/test_cli_startup.py holds them equal).
COMMANDS: dict[str, Entry] = {
    "up": Entry("server", "up", "Start the muster server (and its supervisor) on this machine."),
    "down": Entry("server", "down", "Stop the server of this home. Running trials keep running "
                  "and are reattached by the next `muster up`."),
    "login": Entry("tokens", "login", "Log in to a server: make an API token with your password "
                   "(or take one you have) and keep it for that URL in "
                   "~/.config/muster/credentials (0600)."),
    "logout": Entry("tokens", "logout",
                    "Revoke the token `muster login` kept for a server, and forget it."),
    "whoami": Entry("users", "whoami",
                    "Show who your token acts as: user name, role, and the token's id."),
    "events": Entry("events", "events",
                    "Show the audit trail: every state change and decision, with who made it."),
    "usage": Entry("usage", "usage", "Show slot-hours and GPU-hours: productive, lost, "
                   "stalled, idle, queued, and goodput."),
    "experiment": Entry("experiment", "app", "Create, list, describe and kill experiments."),
    "e": Entry("experiment", "app", "Create, list, describe and kill experiments.", hidden=True),
    "trial": Entry("trial", "app", _TRIAL_HELP),
    "t": Entry("trial", "app", _TRIAL_HELP, hidden=True),
    "checkpoint": Entry("checkpoint", "app", "List, download and garbage-collect checkpoints."),
    "gc": Entry("gc", "app", "Remove what the cluster config's retention says is past keeping."),
    "model": Entry("model", "app", "The model registry: versions of verified trials' "
                   "checkpoints, with their lineage."),
    "cluster": Entry("cluster", "app", "The server's resources."),
    "job": Entry("job", "app", "The queue and what runs; move trials in the queue."),
    "env": Entry("env", "app", "Python environments built for trials."),
    "config": Entry("configs", "app",
                    "Experiment configs: what muster makes of them, without a server."),
    "user": Entry("users", "app", "Users and their roles (admin, user, viewer)."),
    "group": Entry("group", "app", "Groups of users (admins manage them); a group's quota "
                   "holds its members together."),
    "quota": Entry("quota", "app", "Quotas: what each user and group may hold at once."),
    "token": Entry("tokens", "app", "Your API tokens."),
    "session": Entry("sessions", "app", "Your web sessions (the web UI's logins)."),
    "notify": Entry("notify", "app",
                    "Be told when your experiments end, fail, stall or await review."),
    "drill": Entry("drill", "drill", "Drill your training script: run it clean and under "
                   "each fault, and report what muster caught."),
}


def load(name: str) -> Any:
    """The click command for top-level command `name`, importing its module now."""
    entry = COMMANDS[name]
    target = getattr(importlib.import_module(f"muster.cli.{entry.module}"), entry.attribute)
    if isinstance(target, typer.Typer):
        command = _group(target) if _is_group(target) else typer.main.get_command(target)
    else:
        single = typer.Typer(rich_markup_mode=None, add_completion=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    command.hidden = entry.hidden
    return command


def _is_group(app: typer.Typer) -> bool:
    """Whether typer makes `app` a group (else its one command stands alone)."""
    return bool(app.registered_callback or app.info.callback or app.registered_groups
                or len(app.registered_commands) > 1)


def _group(app: typer.Typer) -> TyperGroup:
    """`app`'s group, as typer makes it, but each of its commands made from its function
    when first looked up: typer reads every parameter of a command to make it (~1 ms each),
    and `muster experiment list` runs one of experiment's 14."""
    bare = copy.copy(app)
    bare.registered_commands = []  # its callback and sub-groups are made now, as typer does
    group = typer.main.get_group(bare)
    infos = {_command_name(info): info for info in app.registered_commands}

    def make(name: str) -> Any:
        return typer.main.get_command_from_info(
            infos[name], pretty_exceptions_short=app.pretty_exceptions_short,
            rich_markup_mode=app.rich_markup_mode)

    group.commands = _LoadedOnUse([*infos, *group.commands], make, dict(group.commands))
    return group


def _command_name(info: CommandInfo) -> str:
    """The name typer gives a command: the one it was given, else its function's, dashed."""
    if info.name:
        return info.name
    if info.callback is None:
        raise TypeError("a typer command has no function")
    return typer.main.get_command_name(info.callback.__name__)


class _LoadedOnUse(MutableMapping[str, Any]):
    """A group's `commands` mapping whose entries are made when first read (a top-level
    command's module imported, a subcommand made from its function): click's lookups, typo
    suggestions and completion all see every name."""

    def __init__(self, names: Iterable[str], make: Callable[[str], Any],
                 made: dict[str, Any] | None = None) -> None:
        self._names = dict.fromkeys(names)  # in the order `--help` lists them
        self._make = make
        self._made = made or {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            if name not in self._names:
                raise KeyError(name)
            self._made[name] = self._make(name)
        return self._made[name]

    def __setitem__(self, name: str, command: Any) -> None:
        raise TypeError(f"muster's commands are made from where they are defined, not added "
                        f"({name})")

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"muster's commands cannot be removed ({name})")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class MusterGroup(TyperGroup):
    """The top-level group: subcommands from `COMMANDS`, loaded on use."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _LoadedOnUse(COMMANDS, load)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """List the commands from their short help in `COMMANDS`: `--help` imports none."""
        rows = [(name, entry.help) for name, entry in COMMANDS.items() if not entry.hidden]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _show_version(value: bool) -> None:
    if value:
        from muster import __version__  # not importlib.metadata: a third of the start-up

        print(f"muster {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="muster",
    cls=MusterGroup,
    help="Run training experiments as supervised processes that never report a false success.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


@app.callback()
def _top(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                 help="Show muster's version and exit."),
) -> None:
    """Run training experiments as supervised processes that never report a false success."""


def main() -> None:
    """Console entry point: MusterErrors become one readable line and exit status 1."""
    # httpx imports its own command line (click, rich.progress, pygments: ~60 ms) whenever
    # those are installed; muster's never runs it. A None module makes that import fail,
    # and httpx falls back as it does without its `cli` extra. Only in this process.
    sys.modules.setdefault("httpx._main", cast(ModuleType, None))  # None: "not importable"
    try:
        app(prog_name="muster")  # also under `python -m muster`: usage and completion
    except MusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
