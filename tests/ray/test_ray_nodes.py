"""Nodes that fail, on a real two-node Ray cluster under a real muster server: the bad-node
circuit breaker quarantines a node on which every replica dies (and an admin releases it),
and a node taken away mid-run makes its replica INFRA and the trial restarts on the node
that is left.

The tests run in order on one cluster: the last one takes node b away for good.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from muster.store import ClusterNode, Event, Replica
from tests.ray.conftest import NODE_VARIABLE, RayCluster
from tests.ray.servers import RayServer, serving_on
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(600)]

ENDED = ("SUCCEEDED", "SUSPECT", "FAILED", "CANCELED")

# Dies by SIGKILL on node b (an infra failure: nobody at muster sent it); succeeds elsewhere.
DIES_ON_B = f"""\
import os, signal, sys, time
print("on node", os.environ.get("{NODE_VARIABLE}"), flush=True)
time.sleep(float(sys.argv[1]))
if os.environ.get("{NODE_VARIABLE}") == "b":
    os.kill(os.getpid(), signal.SIGKILL)
"""

# Paced in attempt 1 only (so that a node can be taken away mid-run); a retry runs through.
PACED = """\
import os, sys, time
pace = float(sys.argv[2]) if os.environ.get("MUSTER_ATTEMPT") == "1" else 0.0
for i in range(int(sys.argv[1])):
    print(f"line {i}", flush=True)
    time.sleep(pace)
"""


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RayServer]:
    with serving_on(ray_cluster, tmp_path_factory.mktemp("ray-nodes"),
                    placement_strategy="SPREAD",
                    extra={"node_quarantine": {"failures": 2}}) as running:
        yield running


@pytest.fixture(scope="module")
def node_b(server: RayServer) -> str:
    """Ray's id of node b (the worker started with the custom resource `node_b`)."""
    found: str = server.ray("""
        import json, ray
        ray.init(namespace="muster", log_to_driver=False)
        print(json.dumps([n["NodeID"] for n in ray.nodes()
                          if n["Alive"] and "node_b" in n["Resources"]][0]))
    """)
    return found


def _context(tmp_path: Path, name: str, script: str) -> Path:
    context = tmp_path / name
    context.mkdir()
    (context / "job.py").write_text(script)
    return context


def _trial(server: RayServer, experiment: int) -> dict[str, Any]:
    return server.trials(experiment)[0]


def test_a_node_where_every_replica_dies_is_quarantined_and_released(
    server: RayServer, tmp_path: Path, node_b: str
) -> None:
    config = {"entrypoint": "python job.py 2", "resources": {"replicas": 1},
              "verify": {"require_checkpoint": False},
              "failure_policy": {"replica_restarts": 0, "trial_retries": 12}}
    experiments = [server.submit({**config, "name": f"breaker-{i}"},
                                 _context(tmp_path, f"c{i}", DIES_ON_B)) for i in range(6)]

    def all_ended() -> bool:
        return all(_trial(server, e)["state"] in ENDED for e in experiments)

    wait_until(all_ended, timeout=400, interval=2.0, what="every trial to end")
    trials = [_trial(server, e) for e in experiments]
    assert [t["state"] for t in trials] == ["SUCCEEDED"] * 6, [
        (t["state"], t["message"]) for t in trials]
    with server.store() as store, store.session_scope() as s:
        node = s.get(ClusterNode, node_b)
        assert node is not None and node.quarantined_at is not None
        # (a replica placed there before the quarantine may still fail after it)
        assert len(node.failed_trials) >= 2
        quarantined_at = node.quarantined_at
        events = [e.message or "" for e in s.scalars(select(Event).where(
            Event.reason == "node quarantined"))]
        # Every replica that failed ran on node b, and none was placed there afterwards.
        on_b = s.scalars(select(Replica).where(Replica.node == node_b)).all()
        assert on_b and all(r.reason == "INFRA" for r in on_b), [r.reason for r in on_b]
        launched = [json.loads((Path(r.attempt.run_dir) / f"rank-{r.rank}.launch.json")
                               .read_text())["launched_at"] for r in on_b]
        assert all(at < quarantined_at for at in launched), (launched, quarantined_at)
    assert len(events) == 1 and node_b in events[0] and "2 different trials" in events[0]
    status = {n["id"]: n for n in server.json("cluster", "status")["nodes"]}
    assert status[node_b]["quarantined"] and "in a row" in status[node_b]["quarantine_reason"]
    assert status[node_b]["alive"]

    server.cli("cluster", "node", "release", node_b)
    status = {n["id"]: n for n in server.json("cluster", "status")["nodes"]}
    assert not status[node_b]["quarantined"]
    again = server.cli("cluster", "node", "release", node_b, check=False)
    assert again.returncode != 0 and "not quarantined" in (again.stdout + again.stderr)


def test_a_node_taken_away_mid_run_makes_its_replica_infra_and_the_trial_restarts(
    server: RayServer, ray_cluster: RayCluster, tmp_path: Path, node_b: str
) -> None:
    config = {"name": "node-loss", "entrypoint": "python job.py 120 0.25",
              "resources": {"replicas": 2}, "verify": {"require_checkpoint": False},
              "failure_policy": {"replica_restarts": 0, "stop_grace": "2s"}}
    experiment = server.submit(config, _context(tmp_path, "loss", PACED))
    wait_until(lambda: _trial(server, experiment)["state"] == "RUNNING", timeout=120,
               what="RUNNING")
    first = _trial(server, experiment)["attempts"][0]
    assert {r["node"] for r in first["replicas"]} >= {node_b}  # SPREAD: one rank there

    killed = ray_cluster.remove_node("b")
    assert killed
    wait_until(lambda: _trial(server, experiment)["state"] in ENDED, timeout=300,
               interval=2.0, what="the trial to end after node b was taken away")
    trial = _trial(server, experiment)
    assert (trial["state"], trial["reason"]) == ("SUCCEEDED", "OK"), trial
    lost = [r for r in trial["attempts"][0]["replicas"] if r["node"] == node_b]
    assert lost and lost[0]["reason"] in ("INFRA", "LOST"), lost
    last = trial["attempts"][-1]
    assert {r["node"] for r in last["replicas"]} == {n for n in _alive_nodes(server)}
    status = server.json("cluster", "status")
    assert [n["alive"] for n in status["nodes"] if n["id"] == node_b] == [False]
    assert status["slots"] == 2  # node a's CPUs alone


def _alive_nodes(server: RayServer) -> set[str]:
    return {n["id"] for n in server.json("cluster", "status")["nodes"] if n["alive"]}
