"""Servers whose queue holds still, for the job and cluster tests: one slot, and a first
trial that sleeps in it, so that every later trial (without GPUs) waits in the queue."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from muster.client import Client
from tests.server.experiments import FAST_POLICY, wait_trial
from tests.servers import RunningServer, serving

SLEEP = ["python", "-c", "import time; time.sleep(600)"]


def serving_with(home: Path, *options: str) -> AbstractContextManager[RunningServer]:
    """A real server on `home` with one slot and `options` (`tests.servers.serving`)."""
    return serving(home, options=["--min-free-disk", "0", "--slots", "1", *options])


def create_job(client: Client, context_parent: Path, name: str, *,
               entrypoint: list[str] | None = None, **resources: Any) -> dict[str, Any]:
    """An experiment named `name` with `resources` (e.g. priority=10), from an empty context."""
    config = {"name": name, "entrypoint": entrypoint or ["true"], "resources": resources,
              "failure_policy": FAST_POLICY}
    context = context_parent / f"context-{name}"
    context.mkdir(parents=True)
    return client.create_experiment(json.dumps(config), context)


def start_blocker(client: Client, context_parent: Path, **resources: Any) -> dict[str, Any]:
    """A trial that sleeps in the slot (or on the GPUs) it gets; returns it once RUNNING."""
    exp = create_job(client, context_parent, "blocker", entrypoint=SLEEP, **resources)
    return wait_trial(client, exp["trials"][0]["id"], {"RUNNING"})


def queue_reasons(client: Client, trial_ids: list[int]) -> list[str | None]:
    return [client.get_trial(trial_id)["queue_reason"] for trial_id in trial_ids]
