"""The CLI starts light: a command imports its own module only, a command that only
calls the server builds no config schema, one that makes plain calls (no stream, no
upload) imports no httpx, and listing experiments imports nothing it does not use. (Times
are measured in benchmarks/cli_startup.py, never asserted here; what is imported is
exact.)"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

import muster
from muster.cli import COMMANDS, load
from muster.client import Client
from tests.server.experiments import make_context, submit
from tests.servers import RunningServer

PROBE = """
import json, sys
sys.argv = ["muster", *json.loads(sys.argv[1])]
from muster.cli import main
code = 0
try:
    main()
except SystemExit as exc:  # how the CLI ends: its code is printed and checked
    code = exc.code
imported = sorted(name for name, module in sys.modules.items() if module is not None)
print("\\nMODULES " + json.dumps([code, imported]))  # not names blocked with None
"""


def _imported(*args: str) -> tuple[set[str], str]:
    """The modules `muster ARGS` has imported when it is done, and what it printed."""
    env = {**os.environ, "COLUMNS": "100"}
    env.pop("MUSTER_URL", None)
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=60)
    out, _, tail = done.stdout.rpartition("\nMODULES ")
    code, modules = json.loads(tail)
    assert code in (0, None), f"muster {' '.join(args)} exited {code}: {done.stderr}"
    return set(modules), out + done.stderr


def test_top_level_help_imports_no_subcommand() -> None:
    modules, out = _imported("--help")
    assert "experiment" in out and "Create, list, describe and kill experiments." in out
    assert not {m for m in modules if m.startswith("muster.cli.")}
    assert not {"pydantic", "httpx", "rich", "muster.config", "muster.client"} & modules


def test_a_command_imports_only_its_own_module() -> None:
    modules, out = _imported("job", "set-priority", "--help")
    assert "lower runs first" in out
    cli_modules = {m for m in modules if m.startswith("muster.cli.")}
    assert "muster.cli.job" in cli_modules
    assert not cli_modules & {"muster.cli.experiment", "muster.cli.trial", "muster.cli.server"}


@pytest.mark.parametrize("args", [("experiment", "list", "--help"),
                                  ("job", "list", "--help"), ("trial", "logs", "--help")])
def test_commands_that_call_the_server_build_no_config_schema(args: tuple[str, ...]) -> None:
    modules, out = _imported(*args)
    assert "Usage: muster" in out
    assert "pydantic" not in modules
    assert not {m for m in modules if m.startswith("muster.config")}
    assert not {"click", "pygments", "rich.progress"} & modules  # httpx's own CLI stays out


@pytest.mark.parametrize("args", [("experiment", "list"), ("job", "list")])
def test_commands_that_make_plain_calls_import_no_httpx(
    server: RunningServer, args: tuple[str, ...]
) -> None:
    """Plain calls go through `muster.http_transport`; httpx (~120 ms) waits for a stream."""
    modules, out = _imported(*args, "--json", "--url", server.url, "--home", str(server.home))
    assert isinstance(json.loads(out), list)  # it did call the server
    assert "muster.http_transport" in modules
    assert not {m for m in modules if m.split(".")[0] in ("httpx", "httpcore", "h11", "anyio")}


@pytest.mark.parametrize("args", [("experiment", "list"), ("cluster", "status"),
                                  ("whoami",)])
def test_the_api_shapes_cost_a_command_nothing(server: RunningServer,
                                               args: tuple[str, ...]) -> None:
    """What a command reads is typed by `muster.api`'s shapes for the type checker only: it
    imports neither them (some 70 TypedDicts, ~3.5 ms) nor their pydantic models, which
    stay on the server."""
    modules, out = _imported(*args, "--url", server.url, "--home", str(server.home))
    assert out.strip()  # it did call the server and show the answer
    assert "muster.api" not in modules
    assert not {m for m in modules if m.split(".")[0] in ("pydantic", "pydantic_core")}
    assert not {m for m in modules if m.startswith(("muster.server", "muster.services"))}


# What listing experiments never needs, each a package or module with what is under it: the
# server's stack and store, the config schema and its YAML, the searchers, the launchers,
# what only a submission packs with (tarfile, the run-directory layout), httpx (streams
# only), and rich's table of emoji codes (consoles print text as written).
NOT_FOR_A_LISTING = (
    "sqlalchemy", "alembic", "psycopg", "fastapi", "starlette", "uvicorn", "pydantic",
    "pydantic_core", "optuna", "yaml", "jinja2", "boto3", "psutil", "httpx", "tarfile",
    "muster.server", "muster.services", "muster.store", "muster.config", "muster.search",
    "muster.supervise", "muster.launch", "muster.api", "muster.rundir", "rich._emoji_codes",
)


def _not_for_a_listing(modules: set[str]) -> set[str]:
    return {m for m in modules
            if any(m == heavy or m.startswith(f"{heavy}.") for heavy in NOT_FOR_A_LISTING)}


def test_listing_experiments_imports_nothing_it_does_not_use(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    """The table of a server's experiments, times of day and all, is drawn from typer, rich,
    http.client and muster's own light modules (benchmarks/cli_startup.py times it)."""
    submit(client, make_context(tmp_path, "exit0.sh", name="listed-light"))
    modules, out = _imported("experiment", "list", "--url", server.url,
                             "--home", str(server.home))
    assert "listed-light" in out
    assert not _not_for_a_listing(modules)


def test_help_imports_nothing_it_does_not_use() -> None:
    modules, out = _imported("--help")
    assert "Usage: muster" in out
    assert not _not_for_a_listing(modules)
    assert not {m for m in modules if m.split(".")[0] in ("rich", "http")}


def test_a_name_with_an_emoji_code_is_listed_as_written(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    submit(client, make_context(tmp_path, "exit0.sh", name="smile:smile:"))
    _, out = _imported("experiment", "list", "--name", "smile", "--url", server.url,
                       "--home", str(server.home))
    assert "smile:smile:" in out


def test_version() -> None:
    modules, out = _imported("--version")
    assert out.strip() == f"muster {version('muster')}" == f"muster {muster.__version__}"
    assert not {m for m in modules if m.startswith("muster.cli.")}


def test_a_misspelt_command_is_named_with_a_suggestion() -> None:
    done = subprocess.run([sys.executable, "-m", "muster", "experimnt"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "No such command 'experimnt'. Did you mean 'experiment'?" in done.stderr


def test_shell_completion_reaches_the_loaded_commands() -> None:
    env = {**os.environ, "_MUSTER_COMPLETE": "complete_bash",
           "COMP_WORDS": "muster experiment l",
           "COMP_CWORD": "2"}
    done = subprocess.run([sys.executable, "-m", "muster"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["list"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_listed_help_is_the_commands_own(name: str) -> None:
    """`muster --help` shows COMMANDS' text without importing: it must be what the command
    itself says (its group's help, or its function's docstring's first paragraph)."""
    command = load(name)
    own = " ".join((command.help or "").split("\n\n")[0].split())
    assert own == COMMANDS[name].help
    assert command.hidden == COMMANDS[name].hidden


def test_every_command_of_the_app_is_reachable() -> None:
    group = typer.main.get_command(__import__("muster.cli", fromlist=["app"]).app)
    ctx = typer.Context(group)
    assert group.list_commands(ctx) == list(COMMANDS)
    for name in COMMANDS:
        assert group.get_command(ctx, name) is not None


@pytest.mark.parametrize("name", [name for name, entry in COMMANDS.items()
                                  if entry.attribute == "app" and not entry.hidden])
def test_a_group_makes_the_subcommands_typer_would(name: str) -> None:
    """A group makes each subcommand when it is looked up (typer reads all of a function's
    parameters to make it): the same commands, in the same order, as typer's all at once."""
    made = load(name)
    whole = typer.main.get_command(
        importlib.import_module(f"muster.cli.{COMMANDS[name].module}").app)
    assert isinstance(made, TyperGroup) and isinstance(whole, TyperGroup)
    ctx = typer.Context(made)
    assert made.list_commands(ctx) == whole.list_commands(typer.Context(whole))
    for sub, expected in whole.commands.items():
        command = made.get_command(ctx, sub)
        assert command is not None
        assert (command.name, command.help, command.hidden) == (
            expected.name, expected.help, expected.hidden)
        assert [p.opts for p in command.params] == [p.opts for p in expected.params]
