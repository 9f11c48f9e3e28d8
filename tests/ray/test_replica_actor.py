"""A replica on a Ray node (`muster.launch.ray_replica`), on a real two-node cluster: the
detached, named actor runs muster's shim on the node it is placed on, the shim writes the
same files as under the local launcher, the actor outlives the driver that made it and is
found again by name, and killing the actor leaves no process of the replica anywhere."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from muster.atomic import atomic_write_bytes, json_bytes
from muster.launch.base import ReplicaSpec
from muster.launch.records import spec_to_json
from muster.rundir import RankFiles
from tests.ray.conftest import RayCluster
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

START = """
import json, sys, ray
from muster.launch.ray_replica import actor_name, replica_actor
ray.init(namespace="muster")
name = actor_name("trial-under-test", int(sys.argv[2]), 0)
actor = replica_actor().options(name=name, lifetime="detached",
                                resources={sys.argv[3]: 0.01}).remote(sys.argv[1])
where = ray.get(actor.where.remote(), timeout=60)
nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
print(json.dumps({"where": where, "resources": nodes[where["node_id"]]}))
"""


def _spec(tmp_path: Path, attempt: int, code: str) -> Path:
    """A spec file for one replica running `python -c code`, as the supervisor writes it."""
    attempt_dir = tmp_path / f"attempt-{attempt}"
    attempt_dir.mkdir(parents=True)
    spec = ReplicaSpec(trial_uuid="trial-under-test", attempt=attempt, rank=0,
                       argv=[sys.executable, "-c", code], env=dict(os.environ),
                       cwd=tmp_path, attempt_dir=attempt_dir, stop_grace=2.0)
    files = RankFiles(attempt_dir, 0)
    atomic_write_bytes(files.spec, json_bytes(spec_to_json(spec)), mode=0o600)
    return files.spec


def _start(cluster: RayCluster, spec: Path, attempt: int, node: str) -> dict[str, object]:
    done = cluster.run(START.replace("sys.argv[1]", repr(str(spec)))
                       .replace("int(sys.argv[2])", str(attempt))
                       .replace("sys.argv[3]", repr(node)))
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_actor_runs_the_shim_on_its_node_and_the_files_are_the_local_ones(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, 1, "print('hello from a ray node', flush=True)")
    found = _start(ray_cluster, spec, 1, "node_b")
    assert "node_b" in found["resources"]  # placed where it was asked to be
    files = RankFiles(spec.parent, 0)
    wait_until(files.exit.exists, timeout=60, what="the shim's exit record")
    record = json.loads(files.exit.read_text())
    assert (record["returncode"], record["spawn_error"]) == (0, None)
    assert files.log.read_bytes() == b"hello from a ray node\n"


def test_a_detached_actor_outlives_its_driver_and_its_kill_leaves_no_process(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, 2, "import time; print('up', flush=True); time.sleep(600)")
    found = _start(ray_cluster, spec, 2, "node_a")  # its driver has exited by now
    files = RankFiles(spec.parent, 0)
    wait_until(lambda: files.log.exists() and files.log.read_bytes() == b"up\n", timeout=60,
               what="the training process's first line")
    shim_pid = found["where"]["shim"][0]  # type: ignore[index]
    child = json.loads(files.status.read_text())["child_pid"]
    assert psutil.pid_exists(shim_pid) and psutil.pid_exists(child)

    # A new driver finds the actor by its name, and kills it.
    done = ray_cluster.run("""
        import time
        import ray
        from muster.launch.ray_replica import actor_name
        ray.init(namespace="muster")
        actor = ray.get_actor(actor_name("trial-under-test", 2, 0))
        running = ray.get(actor.poll.remote())
        ray.kill(actor)
        # The kill is asynchronous: a call sent just after it may still be answered. It is
        # done once a call fails for it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get(actor.poll.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                print(running)
                break
            time.sleep(0.2)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "None"  # it was still running

    def gone() -> bool:
        return not any(_alive(pid) for pid in (shim_pid, child))

    wait_until(gone, timeout=30, what="the shim and its child to die with their actor")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
