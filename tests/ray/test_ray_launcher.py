"""`RayLauncher` on a real two-node cluster: the launcher's contract (submit, describe,
idempotent cancel, logs) kept for replicas that run on other nodes, and a restarted driver
(a muster server after a SIGKILL) that describes, stops and loses replicas it never
started, by their actors' names."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from muster.launch.base import ReplicaSpec
from tests.ray.conftest import RayCluster
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

# Run inside the cluster's namespace: `spec` is a ReplicaSpec's fields as JSON.
DRIVER = """
import json, sys, time
from pathlib import Path
from muster.launch.base import ReplicaSpec
from muster.states import ReplicaPhase
from muster.launch.ray_launcher import RayLauncher

fields = json.loads(sys.argv[1])
spec = ReplicaSpec(**{**fields, "cwd": Path(fields["cwd"]),
                      "attempt_dir": Path(fields["attempt_dir"])})
launcher = RayLauncher(resources={sys.argv[2]: 0.01} if sys.argv[2] else None)

def until(phase, timeout=60):
    deadline = time.monotonic() + timeout
    while (status := launcher.describe(spec.attempt_dir, spec.rank)).phase != phase:
        assert time.monotonic() < deadline, (phase, status)
        time.sleep(0.1)
    return status

def report(**found):
    print("RESULT " + json.dumps(found, default=str), flush=True)
"""


def _spec(tmp_path: Path, attempt: int, code: str) -> dict[str, Any]:
    spec = ReplicaSpec(trial_uuid=f"trial-{tmp_path.name}", attempt=attempt, rank=0,
                       argv=[sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path,
                       attempt_dir=tmp_path / f"attempt-{attempt}", stop_grace=1.0)
    fields = {name: getattr(spec, name) for name in ("trial_uuid", "attempt", "rank", "argv",
                                                      "env", "stop_grace")}
    return {**fields, "cwd": str(spec.cwd), "attempt_dir": str(spec.attempt_dir)}


def _drive(cluster: RayCluster, spec: dict[str, Any], node: str, steps: str
           ) -> dict[str, Any]:
    script = DRIVER + steps
    done = cluster.run(script.replace("sys.argv[1]", repr(json.dumps(spec)))
                       .replace("sys.argv[2]", repr(node)))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("RESULT "))
    found: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return found


def test_a_replica_on_another_node_runs_to_its_exit_and_its_actor_ends(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, 1, "print('one', flush=True); print('two', flush=True)")
    found = _drive(ray_cluster, spec, "node_b", """
shim = launcher.submit(spec)
status = until(ReplicaPhase.EXITED)
log = b"".join(launcher.log_iter(spec.attempt_dir, 0))
launch = json.loads((spec.attempt_dir / "rank-0.launch.json").read_text())
deadline = time.monotonic() + 30
while launcher._handle(launch["actor"]) is not None and time.monotonic() < deadline:
    time.sleep(0.2)
report(returncode=status.exit.returncode, log=log.decode(), launch=launch,
       actor_left=launcher._handle(launch["actor"]) is not None,
       ranks=launcher.logged_ranks(spec.attempt_dir))
""")
    assert found["returncode"] == 0
    assert found["log"] == "one\ntwo\n"
    assert found["launch"]["actor"] == f"muster:trial-{tmp_path.name}:1:0"
    assert found["launch"]["hostname"] and found["launch"]["node_id"]
    assert found["actor_left"] is False  # it ended itself once its shim had
    assert found["ranks"] == [0]


def test_cancel_stops_a_running_replica_once_however_often_it_is_asked(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, 2, "import time; print('up', flush=True); time.sleep(600)")
    found = _drive(ray_cluster, spec, "node_a", """
launcher.submit(spec)
until(ReplicaPhase.RUNNING)
for _ in range(3):
    launcher.cancel(spec.attempt_dir, 0, grace=1.0)
status = until(ReplicaPhase.EXITED)
report(stop=status.stop_requested, signal=status.exit.signal,
       sent=status.exit.signals_sent)
""")
    assert found["stop"] is True
    assert found["signal"] == "SIGTERM" and found["sent"] == ["SIGTERM"]


def test_a_restarted_driver_finds_a_replica_by_its_actor_and_a_killed_actor_is_lost(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, 3, "import time; print('up', flush=True); time.sleep(600)")
    first = _drive(ray_cluster, spec, "node_b", """
launcher.submit(spec)
status = until(ReplicaPhase.RUNNING)
report(child=status.child.pid)
""")  # this driver, the server that launched it, is gone now
    second = _drive(ray_cluster, spec, "", """
import ray
running = launcher.describe(spec.attempt_dir, 0)
launch = json.loads((spec.attempt_dir / "rank-0.launch.json").read_text())
ray.kill(launcher._handle(launch["actor"]))
lost = until(ReplicaPhase.LOST, timeout=30)
report(running=running.phase.value, child=running.child.pid, lost=lost.phase.value)
""")
    assert second["running"] == "RUNNING" and second["child"] == first["child"]
    assert second["lost"] == "LOST"
    # The training process went with its actor (the raylet reaps what a dead worker leaves).
    wait_until(lambda: not Path(f"/proc/{first['child']}").exists()
               or "Z" in Path(f"/proc/{first['child']}/stat").read_text().split()[2],
               timeout=30, what="the training process to die with its actor")
