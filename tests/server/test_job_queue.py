"""`GET /jobs`, the priority routes and `GET /metrics` on a real server with one slot."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster import errors
from muster.client import Client
from tests.server.experiments import wait_ended, wait_trial
from tests.server.exposition import parse
from tests.server.queueing import create_job, queue_reasons, serving_with, start_blocker
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving_with(tmp_path_factory.mktemp("server") / "home") as running:
        yield running


@pytest.fixture(scope="module")
def blocker(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The trial that holds the one slot for the whole module."""
    with server.client() as c:
        return start_blocker(c, tmp_path_factory.mktemp("blocker"))


@pytest.fixture
def queued(client: Client, blocker: dict[str, Any], tmp_path: Path
           ) -> Iterator[list[dict[str, Any]]]:
    """Three experiments queued behind the blocker, of priorities 50, 42 (the default) and
    10, in that order; killed afterwards so the next test finds the queue empty."""
    exps = [create_job(client, tmp_path, "low", priority=50),
            create_job(client, tmp_path, "default"),
            create_job(client, tmp_path, "high", priority=10)]
    yield exps
    for exp in exps:
        with contextlib.suppress(errors.Conflict):  # a test may have killed it already
            client.kill_experiment(exp["id"])


def trial_ids(exps: list[dict[str, Any]]) -> list[int]:
    return [exp["trials"][0]["id"] for exp in exps]


def wait_positions(client: Client, ids: list[int]) -> list[str | None]:
    """The queue reasons of `ids` once they are positions 1, 2, ... in that order."""
    def in_order() -> list[str | None]:
        reasons = queue_reasons(client, ids)
        ok = all((r or "").startswith(f"position {n}: ") for n, r in enumerate(reasons, 1))
        return reasons if ok else []
    return wait_until(in_order, timeout=30, what=f"trials {ids} to queue in this order")


@pytest.mark.timeout(120)
def test_jobs_list_what_runs_then_the_queue_by_priority(
    client: Client, blocker: dict[str, Any], queued: list[dict[str, Any]]
) -> None:
    low, default, high = trial_ids(queued)
    reasons = wait_positions(client, [high, default, low])
    assert reasons[0] == "position 1: waiting for 1 slot, 0 free"
    jobs = client.list_jobs()
    assert [job["trial_id"] for job in jobs] == [blocker["id"], high, default, low]
    running, first = jobs[0], jobs[1]
    assert running["state"] == "RUNNING" and running["queue_reason"] is None
    assert first == {
        "trial_id": high, "experiment_id": queued[2]["id"], "experiment_name": "high",
        "owner": "admin",
        "state": "QUEUED", "priority": 10, "replicas": 1, "gpus_per_replica": 0,
        "gpu_type": None, "gpus": [], "queue_reason": reasons[0], "progress": None,
    }
    assert [job["priority"] for job in jobs[1:]] == [10, 42, 50]


@pytest.mark.timeout(120)
def test_a_new_priority_reorders_the_queue(
    client: Client, queued: list[dict[str, Any]]
) -> None:
    low, default, high = trial_ids(queued)
    wait_positions(client, [high, default, low])
    trial = client.set_trial_priority(low, 5)
    assert trial["priority"] == 5
    wait_positions(client, [low, high, default])
    assert [j["trial_id"] for j in client.list_jobs()][1:] == [low, high, default]
    event = [e for e in trial["events"] if e["reason"] == "priority changed"]
    assert [(e["message"], e["actor"]) for e in event] == [("priority 50 → 5", "admin")]


@pytest.mark.timeout(120)
def test_an_experiment_priority_moves_its_trials_and_its_future_ones(
    client: Client, queued: list[dict[str, Any]]
) -> None:
    low, default, high = trial_ids(queued)
    exp = client.set_experiment_priority(queued[1]["id"], 1)
    assert exp["priority"] == 1 and exp["trials"][0]["priority"] == 1
    wait_positions(client, [default, high, low])


@pytest.mark.timeout(120)
def test_priority_errors(server: RunningServer, client: Client,
                         queued: list[dict[str, Any]]) -> None:
    low, _, _ = trial_ids(queued)
    headers = {"Authorization": f"Bearer {server.token}"}
    for bad in (0, 100):
        answer = httpx.post(f"{server.url}/api/v1/trials/{low}/priority", headers=headers,
                            json={"priority": bad})
        assert answer.status_code == 422
        assert answer.json()["error"] == "InvalidRequest"
        assert "priority" in answer.json()["message"]
    with pytest.raises(errors.NotFound, match="trial 99999 does not exist"):
        client.set_trial_priority(99999, 10)
    client.kill_experiment(queued[0]["id"])
    ended = wait_ended(client, queued[0]["id"])
    assert ended["state"] == "CANCELED"
    with pytest.raises(errors.Conflict, match=f"trial {low} is CANCELED: it will not run"):
        client.set_trial_priority(low, 10)
    with pytest.raises(errors.Conflict, match=f"experiment {ended['id']} is CANCELED"):
        client.set_experiment_priority(ended["id"], 10)
    assert client.get_trial(low)["priority"] == 50


@pytest.mark.timeout(60)
def test_metrics_need_the_token_and_parse(server: RunningServer, client: Client,
                                          blocker: dict[str, Any]) -> None:
    url = f"{server.url}/api/v1/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    token = server.token
    answer = httpx.get(url, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    parsed = parse(answer.text)
    assert parsed.value("muster_slots_total") == 1
    assert parsed.value("muster_slots_used") == 1
    assert parsed.value("muster_trials", state="RUNNING") == 1
    assert parsed.value("muster_disk_free_bytes", path=str(server.home)) is not None
    wait_trial(client, blocker["id"], {"RUNNING"})  # still there: it holds the slot
    # Also at Prometheus's default path, behind the same token.
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    root = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert parse(root.text).value("muster_slots_total") == 1
