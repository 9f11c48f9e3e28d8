"""`muster job list` and `muster job set-priority`, run as real subprocesses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.client import Client
from tests.cli.test_cli import assert_clean_failure, on
from tests.server.experiments import wait_ended
from tests.server.queueing import create_job, serving_with, start_blocker
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One slot, held by a sleeping trial, so that every experiment made here queues."""
    with serving_with(tmp_path_factory.mktemp("server") / "home") as running:
        with running.client() as c:
            start_blocker(c, tmp_path_factory.mktemp("blocker"))
        yield running


@pytest.mark.timeout(120)
def test_job_list_and_set_priority(server: RunningServer, client: Client,
                                   tmp_path: Path) -> None:
    first = create_job(client, tmp_path, "first")
    second = create_job(client, tmp_path, "second")
    done = on(server, "job", "set-priority", str(second["trials"][0]["id"]), "3")
    assert done.returncode == 0, done.stderr
    assert f"trial {second['trials'][0]['id']}: priority 3" in done.stdout

    def second_first() -> list[dict[str, object]]:
        jobs = json.loads(on(server, "job", "list", "--json").stdout)
        queued = [job for job in jobs if job["state"] == "QUEUED"]
        ok = ([job["experiment_name"] for job in queued] == ["second", "first"]
              and str(queued[0]["queue_reason"]).startswith("position 1: "))
        return jobs if ok else []

    jobs = wait_until(second_first, timeout=30, what="the second experiment to queue first")
    assert jobs[0]["experiment_name"] == "blocker" and jobs[0]["state"] == "RUNNING"
    human = on(server, "job", "list")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    rows = [next(i for i, line in enumerate(lines) if name in line)
            for name in ("blocker", "second", "first")]
    assert rows == sorted(rows)
    assert "position 1: waiting for 1 slot, 0 free" in human.stdout
    done = on(server, "job", "set-priority", str(first["id"]), "1", "--experiment", "--json")
    assert json.loads(done.stdout)["priority"] == 1
    for exp in (first, second):
        client.kill_experiment(exp["id"])


@pytest.mark.timeout(120)
def test_set_priority_errors_are_one_line(server: RunningServer, client: Client,
                                          tmp_path: Path) -> None:
    out_of_range = on(server, "job", "set-priority", "1", "100")
    assert out_of_range.returncode == 2
    assert "100 is not in the range 1<=x<=99" in out_of_range.stderr
    exp = create_job(client, tmp_path, "ended")
    client.kill_experiment(exp["id"])
    wait_ended(client, exp["id"])
    stderr = assert_clean_failure(on(server, "job", "set-priority",
                                     str(exp["trials"][0]["id"]), "5"))
    assert "is CANCELED: it will not run again" in stderr
    stderr = assert_clean_failure(on(server, "job", "set-priority", str(exp["id"]), "5",
                                     "--experiment"))
    assert f"experiment {exp['id']} is CANCELED" in stderr
