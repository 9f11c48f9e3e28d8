"""A running trial's progress and ETA in `muster job list`, `muster trial describe` and
`muster experiment watch`, run as real subprocesses against a real server, on a real trial
that reported half its planned steps (tests/fixtures/planned_progress.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.cli.test_cli import on
from tests.servers import RunningServer
from tests.supervise.conftest import FIXTURES
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes


def start_half_done(client: Client, tmp_path: Path, gate: Path) -> dict[str, Any]:
    """An experiment whose trial plans 10 steps, reports 5 and waits for `gate`."""
    config = {"name": "half-done",
              "entrypoint": [sys.executable, str(FIXTURES / "planned_progress.py"), "steps",
                             "10", "5", str(gate)],
              "failure_policy": {"stop_grace": 1.0}}
    context = tmp_path / "context"
    context.mkdir()
    return client.create_experiment(json.dumps(config), context)


def job_with_a_rate(client: Client, trial_id: int) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        job = next((j for j in client.list_jobs() if j["trial_id"] == trial_id), None)
        progress = job and job.get("progress")
        return job if progress and progress["done"] == 5 and progress["rate_per_s"] else None
    job = wait_until(found, timeout=60, what=f"trial {trial_id} to report its 5 steps")
    assert isinstance(job, dict)
    return job


@pytest.mark.timeout(120)
def test_job_list_and_watch_show_progress_and_eta(server: RunningServer, client: Client,
                                                  tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    exp = start_half_done(client, tmp_path, gate)
    trial_id = exp["trials"][0]["id"]
    job_with_a_rate(client, trial_id)
    listed = json.loads(on(server, "job", "list", "--json").stdout)
    [progress] = [j["progress"] for j in listed if j["trial_id"] == trial_id]
    assert (progress["done"], progress["planned"], progress["fraction"], progress["unit"],
            progress["planned_by"], progress["measured_by"]) == (
        5, 10, 0.5, "steps", "ctx.plan()", "harness")
    human = on(server, "job", "list")
    assert human.returncode == 0, human.stderr
    [row] = [line for line in human.stdout.splitlines() if "half-done" in line]
    assert "5 of 10 steps (50%), ETA " in row and "ETA unknown" not in row
    described = on(server, "trial", "describe", str(trial_id))
    assert "progress: 5 of 10 steps (50%), ETA " in described.stdout, described.stderr

    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "PYTHONUNBUFFERED": "1"}
    watching = subprocess.Popen([sys.executable, "-m", "muster", "experiment", "watch",
                                 str(exp["id"])], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        assert watching.stdout is not None
        first = watching.stdout.readline()  # not a terminal: one line per change
        assert first.rstrip().endswith(f"; trial {trial_id} at 50%"), first
        gate.touch()  # it exits 0 short of its plan: SUSPECT, and the watch ends
        rest, err = watching.communicate(timeout=60)
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    assert f"trial {trial_id} at" not in rest.splitlines()[-1]
    assert "SUSPECT" in err
