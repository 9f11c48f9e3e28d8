"""Creating experiments from the fixture scripts and waiting for them, for the server tests.

Each experiment gets its own context directory (a copy of one fixture script plus its
config), so tests never share files and the snapshot the server takes is of a real folder.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

from muster.client import Client
from tests.waiting import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENDED = frozenset({"COMPLETED", "CANCELED", "ERROR"})
TRIAL_ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELED"})
# Small enough that kill tests end quickly, large enough for a script to react to SIGTERM.
FAST_POLICY: dict[str, Any] = {"stop_grace": "2s"}

_contexts = itertools.count(1)


def interpreter(fixture: str) -> str:
    """The program that runs a fixture: `sh` for shell scripts, muster's `python` otherwise."""
    return "sh" if fixture.endswith(".sh") else "python"


def config_text(
    entrypoint: list[str], *, name: str = "test", failure_policy: dict[str, Any] | None = None
) -> str:
    """An experiment config in YAML (JSON is YAML, and quoting is then never a question)."""
    config: dict[str, Any] = {"name": name, "entrypoint": entrypoint}
    config["failure_policy"] = {**FAST_POLICY, **(failure_policy or {})}
    return json.dumps(config, indent=2) + "\n"


def write_context(
    parent: Path, entrypoint: list[str], *, files: dict[str, str] | None = None,
    name: str = "test", failure_policy: dict[str, Any] | None = None,
) -> Path:
    """A fresh context directory under `parent` with `files` and its `experiment.yaml`."""
    context = parent / f"context-{next(_contexts)}"
    context.mkdir(parents=True)
    for relative, text in (files or {}).items():
        (context / relative).write_text(text)
    config = config_text(entrypoint, name=name, failure_policy=failure_policy)
    (context / "experiment.yaml").write_text(config)
    return context


def make_context(
    parent: Path, fixture: str, *args: str, name: str = "test",
    failure_policy: dict[str, Any] | None = None,
) -> Path:
    """A fresh context directory under `parent` that runs `fixture args...`."""
    entrypoint = [interpreter(fixture), fixture, *args]
    context = write_context(parent, entrypoint, name=name, failure_policy=failure_policy)
    shutil.copy2(FIXTURES / fixture, context / fixture)
    return context


def submit(client: Client, context: Path) -> dict[str, Any]:
    """Create an experiment from a context directory made by `write_context`/`make_context`."""
    return client.create_experiment((context / "experiment.yaml").read_text(), context)


def create(
    client: Client, parent: Path, fixture: str, *args: str, name: str = "test",
    failure_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create an experiment that runs `fixture args...`; returns the created experiment."""
    return submit(client, make_context(parent, fixture, *args, name=name,
                                       failure_policy=failure_policy))


def wait_ended(client: Client, experiment_id: int, timeout: float = 60.0) -> dict[str, Any]:
    """The experiment once it has reached a terminal state."""

    def ended() -> dict[str, Any]:
        exp = client.get_experiment(experiment_id)
        return exp if exp["state"] in ENDED else {}

    return wait_until(ended, timeout=timeout, what=f"experiment {experiment_id} to end",
                      interval=0.05)


def wait_trial(
    client: Client, trial_id: int, states: frozenset[str] | set[str], timeout: float = 60.0
) -> dict[str, Any]:
    """The trial once its state is one of `states`."""

    def reached() -> dict[str, Any]:
        trial = client.get_trial(trial_id)
        return trial if trial["state"] in states else {}

    return wait_until(reached, timeout=timeout, what=f"trial {trial_id} to be in {set(states)}",
                      interval=0.05)


def run_to_end(
    client: Client, parent: Path, fixture: str, *args: str,
    failure_policy: dict[str, Any] | None = None, timeout: float = 60.0,
) -> dict[str, Any]:
    """Create an experiment from `fixture` and return it once it has ended."""
    exp = create(client, parent, fixture, *args, failure_policy=failure_policy)
    return wait_ended(client, exp["id"], timeout=timeout)


def only_trial(exp: dict[str, Any]) -> dict[str, Any]:
    trials = exp["trials"]
    assert len(trials) == 1, trials
    trial: dict[str, Any] = trials[0]
    return trial


def attempt_dir(home: Path, trial: dict[str, Any], number: int) -> Path:
    return home / "runs" / str(trial["uuid"]) / f"attempt-{number}"


def shim_record(home: Path, trial: dict[str, Any], number: int = 1) -> dict[str, Any]:
    """The shim's `rank-0.shim.json` of an attempt, once the shim has written it."""
    path = attempt_dir(home, trial, number) / "rank-0.shim.json"
    wait_until(path.exists, timeout=30, what=f"{path} to be written")
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def read_whole_log(
    client: Client, trial_id: int, attempt: int | None = None, limit: int | None = None
) -> bytes:
    """The whole log through the API, by byte cursor (offset/limit, `X-Muster-Next-Offset`)."""
    parts: list[bytes] = []
    offset = 0
    while True:
        piece = client.read_logs(trial_id, attempt=attempt, offset=offset, limit=limit)
        if not piece.data:
            return b"".join(parts)
        parts.append(piece.data)
        attempt, offset = piece.attempt, piece.next_offset
