"""A rank lost before the primary's exit 0 fails the attempt, however late Ray reports it
(issue 30, item 8a), on a real two-node Ray cluster under a real muster server.

Node b is taken away (every process on it SIGKILLed) while its rank works; rank 0 exits 0
just after. Ray's GCS marks node b's actors dead only when its health checks give up,
seconds later, so muster sees rank 1 RUNNING, then rank 0's exit 0, and only then rank 1
LOST. Ordered by when muster noticed, the loss came after the primary's exit and the trial
was SUCCEEDED; ordered by when rank 1 was last known alive (its shim's liveness stamp), it
came before, and the attempt fails.

Its own cluster: the test takes node b away for good.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ray.conftest import NODE_VARIABLE, RayCluster
from tests.ray.servers import RayServer, serving_on
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(600)]

ENDED = ("SUCCEEDED", "SUSPECT", "FAILED", "CANCELED")
PLACEMENT_TRIES = 12  # (1/2)**12: one run in 4,096 would not get the placement it needs

# The rank on node b works until its node is taken away; the other one exits 0 once the
# file named by argv[1] exists (the test writes it after the kill).
JOB = f"""\
import os, pathlib, sys, time
node = os.environ.get("{NODE_VARIABLE}")
print("rank", os.environ["RANK"], "on node", node, flush=True)
if node == "b":
    while True:
        print("working", flush=True)
        time.sleep(0.2)
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.02)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RayServer]:
    # SPREAD: a 2-replica trial gets one rank on each node.
    with serving_on(ray_cluster, tmp_path_factory.mktemp("ray-lost"),
                    placement_strategy="SPREAD") as running:
        yield running


def _nodes(server: RayServer) -> dict[str, str]:
    """Ray's node ids by the test's node names ("a", "b")."""
    found: dict[str, str] = server.ray("""
        import json, ray
        ray.init(namespace="muster", log_to_driver=False)
        print(json.dumps({("a" if "node_a" in n["Resources"] else "b"): n["NodeID"]
                          for n in ray.nodes() if n["Alive"]}))
    """)
    return found


def _actor_end_ms(server: RayServer, name: str) -> dict[str, Any]:
    """Ray's record of the actor called `name`: its state and end time (ms)."""
    found: dict[str, Any] = server.ray(f"""
        import json, ray
        from ray._private.state import state
        ray.init(namespace="muster", log_to_driver=False)
        actors = [a for a in state.actor_table(None).values() if a["Name"] == {name!r}]
        print(json.dumps({{"state": actors[0]["State"], "end_ms": actors[0]["EndTime"]}}))
    """)
    return found


def test_a_rank_lost_before_the_primarys_exit_0_fails_the_attempt_though_ray_says_so_later(
    server: RayServer, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "job.py").write_text(JOB)
    go = tmp_path / "go"
    config = {"name": "lost-first", "entrypoint": f"python job.py {go}",
              "resources": {"replicas": 2}, "verify": {"require_checkpoint": False},
              "failure_policy": {"replica_restarts": 0, "trial_retries": 0,
                                 "stop_grace": "2s"}}
    nodes = _nodes(server)
    # SPREAD puts one rank on each node, but which one where is Ray's choice: a trial whose
    # rank 1 is not on node b (the one the test can take away) is killed and submitted again.
    for _ in range(PLACEMENT_TRIES):
        experiment = server.submit(config, context)
        trial = server.wait_trial(experiment, lambda t: t["state"] == "RUNNING",
                                  what="RUNNING")
        (attempt,) = trial["attempts"]
        on = {r["rank"]: r["node"] for r in attempt["replicas"]}
        if on == {0: nodes["a"], 1: nodes["b"]}:
            break
        assert sorted(on.values()) == sorted(nodes.values()), (on, nodes)  # SPREAD
        server.cli("experiment", "kill", str(experiment))
        server.wait_trial(experiment, lambda t: t["state"] in ENDED, what="the kill")
    else:
        raise AssertionError(f"rank 1 never landed on node b in {PLACEMENT_TRIES} tries")
    run_dir = Path(attempt["run_dir"])
    # Rank 1 has been seen alive (its liveness stamp) before its node goes.
    wait_until(lambda: (run_dir / "rank-1.alive").exists(), timeout=30,
               what="rank 1's liveness stamp")

    assert ray_cluster.remove_node("b")
    go.touch()  # rank 0 exits 0 now, while Ray still reports rank 1's actor alive

    trial = server.wait_trial(experiment, lambda t: t["state"] in ENDED, timeout=300,
                              what="the trial to end after node b was taken away")
    replicas = {r["rank"]: r for r in trial["attempts"][0]["replicas"]}
    assert replicas[0]["reason"] == "OK", replicas[0]
    assert replicas[1]["reason"] == "LOST", replicas[1]
    assert (trial["state"], trial["reason"]) == ("FAILED", "LOST"), trial
    # Muster learnt of the loss after rank 0's exit 0: Ray's death time of rank 1's actor
    # (when its GCS noticed) is later than that exit; the stamp is earlier.
    rank0_end = json.loads((run_dir / "rank-0.exit.json").read_text())["ended_at"]
    actor = _actor_end_ms(server, f"muster:{trial['uuid']}:1:1")
    assert actor["state"] == "DEAD" and actor["end_ms"] / 1000 > rank0_end, (actor, rank0_end)
    assert (run_dir / "rank-1.alive").stat().st_mtime < rank0_end
    assert not (run_dir / "rank-1.exit.json").exists()
