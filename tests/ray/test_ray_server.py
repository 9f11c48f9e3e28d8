"""muster with `launcher: ray` end to end, on a real two-node Ray cluster: a real server (in
the cluster's network namespace) connected by its cluster config, the real CLI, the 2-rank
DDP digits example with its ranks on different nodes, a SIGKILLed rank, a server SIGKILLed
mid-run, a kill that leaves nothing behind, and a replica set that does not fit.

One cluster and one server for the module (each test submits its own experiments); the
timeouts only bound how long a broken run hangs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ray.conftest import RayCluster
from tests.ray.servers import RayServer, serving_on
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(600)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
PACED_RUNNER = Path(__file__).resolve().parents[1] / "examples" / "paced.py"
ENDED = ("SUCCEEDED", "SUSPECT", "FAILED", "CANCELED")

# Prints numbered lines at a steady pace, then exits 0 (no harness): a log to count. It ends
# with a distributed job's final barrier: once the primary (rank 0) has exited 0, muster stops
# the other ranks, so a rank that ran a few lines behind (ranks start apart, and drift apart
# on a loaded machine) would be stopped short of its last lines, as designed. Rank 0 leaves
# after every rank has written its last line (a file per rank in the shared working
# directory).
PACED = """\
import os, pathlib, sys, time
n = int(sys.argv[1])
for i in range(n):
    if i == n // 2 and len(sys.argv) > 3:  # half-way, wait for the file argv[3]
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.02)
    print(f"line {i:05d} " + "x" * 40, flush=True)
    time.sleep(float(sys.argv[2]))
done = f"done-{os.environ['MUSTER_ATTEMPT']}-{{}}"
pathlib.Path(done.format(os.environ.get("RANK", "0"))).touch()
world = range(int(os.environ.get("WORLD_SIZE", "1")))
while os.environ.get("RANK", "0") == "0" and not all(
        pathlib.Path(done.format(r)).exists() for r in world):
    time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RayServer]:
    # SPREAD: with both nodes free, a 2-replica trial gets one rank on each.
    with serving_on(ray_cluster, tmp_path_factory.mktemp("ray-server"),
                    placement_strategy="SPREAD") as running:
        yield running


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch", reason="the DDP example needs the 'examples' extra")
    out = tmp_path_factory.mktemp("digits") / "data"
    subprocess.run([sys.executable, str(EXAMPLE / "prepare_data.py"), "--out", str(out)],
                   capture_output=True, timeout=120, check=True)
    return out


def _ddp_context(tmp_path: Path, digits: Path) -> Path:
    context = tmp_path / "context"
    context.mkdir()
    for name in ("ddp.py", "train.py"):
        shutil.copy2(EXAMPLE / name, context / name)
    shutil.copytree(digits, context / "data")
    return context


def _paced_context(tmp_path: Path) -> Path:
    context = tmp_path / "context"
    context.mkdir()
    (context / "paced.py").write_text(PACED)
    return context


def _ended(trial: dict[str, Any]) -> bool:
    return trial["state"] in ENDED


def _replicas(trial: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for a in trial["attempts"] for r in a["replicas"]]


def _ray_nodes(server: RayServer) -> dict[str, dict[str, Any]]:
    status = server.json("cluster", "status")
    return {node["id"]: node for node in status["nodes"]}


def test_cluster_status_lists_rays_nodes(server: RayServer) -> None:
    status = server.json("cluster", "status")
    nodes = status["nodes"]
    assert len(nodes) == 2 and all(n["alive"] for n in nodes), nodes
    assert sorted((n["cpus"], n["gpus"]) for n in nodes) == [(2, 0), (2, 1)]
    assert all(n["address"] == "127.0.0.1" and len(n["id"]) == 56 for n in nodes)
    assert status["slots"] == 4  # every node's CPUs, one per replica
    assert not any(n["quarantined"] for n in nodes)


def test_the_ddp_example_runs_its_ranks_on_two_nodes_and_is_verified(
    server: RayServer, tmp_path: Path, digits: Path
) -> None:
    config = yaml.safe_load((EXAMPLE / "ddp.yaml").read_text())
    config["entrypoint"] = "python ddp.py --data data --epochs 3"
    experiment = server.submit({**config, "name": "ddp-on-ray"}, _ddp_context(tmp_path, digits))
    trial = server.wait_trial(experiment, _ended, what="the DDP trial to end")
    assert (trial["state"], trial["reason"]) == ("SUCCEEDED", "OK"), trial
    checks = {c["name"]: c for c in trial["verification"]["checks"]}
    assert checks["samples"]["passed"], checks["samples"]
    nodes = _ray_nodes(server)
    (attempt,) = trial["attempts"]
    ranks = {r["rank"]: r["node"] for r in attempt["replicas"]}
    assert set(ranks) == {0, 1}
    assert ranks[0] != ranks[1] and set(ranks.values()) <= set(nodes), ranks
    # Each rank's launch record says the same node, and both met at rank 0's node.
    run_dir = Path(attempt["run_dir"])
    for rank, node in ranks.items():
        launch = json.loads((run_dir / f"rank-{rank}.launch.json").read_text())
        assert launch["node_id"] == node
        assert launch["actor"] == f"muster:{trial['uuid']}:1:{rank}"
    master = json.loads((run_dir / "master.json").read_text())
    assert master["addr"] == nodes[ranks[0]]["address"]
    for rank in (0, 1):  # torchrun's per-node variables: one rank on each node
        env = json.loads((run_dir / f"rank-{rank}.spec.json").read_text())["env"]
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (master["addr"], str(master["port"]))
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"],
                env["GROUP_WORLD_SIZE"]) == ("0", "1", str(rank), "2")
    assert str(run_dir).startswith(str(server.shared))  # on the shared storage_path
    _assert_nothing_left(server, trial["uuid"])


def test_a_sigkilled_rank_restarts_the_trial_from_its_checkpoint(
    server: RayServer, tmp_path: Path, digits: Path
) -> None:
    config = yaml.safe_load((EXAMPLE / "ddp.yaml").read_text())
    # Slowed down in attempt 1 (tests/examples/paced.py), so the kill lands mid-run.
    config["entrypoint"] = "python paced.py ddp.py --data data --epochs 3"
    config["environment"]["variables"]["MUSTER_TEST_PACE"] = "0.1"
    config["failure_policy"]["stop_grace"] = "2s"
    context = _ddp_context(tmp_path, digits)
    shutil.copy2(PACED_RUNNER, context / "paced.py")
    experiment = server.submit({**config, "name": "ddp-kill"}, context)
    trial = server.wait_trial(experiment, lambda t: bool(t["attempts"]), what="attempt 1")
    run_dir = Path(trial["attempts"][0]["run_dir"])
    wait_until(lambda: any((run_dir.parent / "checkpoints").glob("*/metadata.json")),
               timeout=240, what="epoch 1's checkpoint")
    child = json.loads((run_dir / "rank-1.shim.json").read_text())["child_pid"]
    os.kill(child, signal.SIGKILL)  # the training process of rank 1, on its node
    trial = server.wait_trial(experiment, _ended, what="the trial to end after the kill")
    assert (trial["state"], trial["reason"]) == ("SUCCEEDED", "OK"), trial
    first, _ = trial["attempts"]
    killed = {r["rank"]: r for r in first["replicas"]}[1]
    assert (killed["reason"], killed["signal"]) == ("INFRA", "SIGKILL"), killed
    assert "resumed from" in _log(server, trial["id"], attempt=2)
    _assert_nothing_left(server, trial["uuid"])


def test_a_server_sigkilled_mid_run_reattaches_and_every_log_line_is_there_once(
    server: RayServer, tmp_path: Path
) -> None:
    # The ranks stop half-way until the server is back, so that it follows them to their
    # end (not only finds it), rank 0's exit 0 included.
    back = tmp_path / "server-back"
    config = {"name": "paced-on-ray", "entrypoint": f"python paced.py 200 0.05 {back}",
              "resources": {"replicas": 2}, "verify": {"require_checkpoint": False}}
    experiment = server.submit(config, _paced_context(tmp_path))
    trial = server.wait_trial(experiment, lambda t: bool(t["attempts"]), what="attempt 1")
    run_dir = Path(trial["attempts"][0]["run_dir"])
    # Mid-run: both ranks are logging. (Read from their files: on a loaded machine the
    # supervisor's pass that records RUNNING can come after a short run has ended.)
    wait_until(lambda: all(_size(run_dir / f"rank-{r}.log") > 0 for r in (0, 1)), timeout=120,
               what="both ranks to log")
    server.kill()
    logged = (run_dir / "rank-0.log").stat().st_size
    wait_until(lambda: (run_dir / "rank-0.log").stat().st_size > logged + 500, timeout=60,
               what="the replicas to go on logging without a server")
    reattached = "reconciled replicas: {'RUNNING': 2}"
    before = server.log().count(reattached)
    server.start()
    wait_until(lambda: server.log().count(reattached) > before, timeout=60,
               what="the restarted server to reattach to both running ranks")
    back.touch()
    trial = server.wait_trial(experiment, _ended, what="the trial to end after the restart")
    assert (trial["state"], trial["reason"]) == ("SUCCEEDED", "OK"), trial
    assert len(trial["attempts"]) == 1  # reattached, not restarted
    expected = "".join(f"line {i:05d} " + "x" * 40 + "\n" for i in range(200))
    for rank in (0, 1):
        assert _log(server, trial["id"], rank=rank) == expected
    _assert_nothing_left(server, trial["uuid"])


def test_killing_an_experiment_leaves_no_actor_group_or_process(
    server: RayServer, tmp_path: Path
) -> None:
    config = {"name": "killed-on-ray", "entrypoint": "python paced.py 100000 0.1",
              "resources": {"replicas": 2}, "failure_policy": {"stop_grace": "2s"}}
    experiment = server.submit(config, _paced_context(tmp_path))
    trial = server.wait_trial(experiment, lambda t: t["state"] == "RUNNING", what="RUNNING")
    run_dir = Path(trial["attempts"][0]["run_dir"])
    pids = [json.loads((run_dir / f"rank-{r}.shim.json").read_text())[key]
            for r in (0, 1) for key in ("shim_pid", "child_pid")]
    server.cli("experiment", "kill", str(experiment))
    trial = server.wait_trial(experiment, _ended, what="the kill")
    assert trial["state"] == "CANCELED", trial
    wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=30,
               what="every shim and training process to be gone")
    _assert_nothing_left(server, trial["uuid"])


def test_a_replica_set_that_does_not_fit_waits_with_rays_reason_then_fails_capacity(
    server: RayServer, tmp_path: Path
) -> None:
    config = {"name": "too-big", "entrypoint": "python paced.py 1 0",
              "resources": {"replicas": 3, "gpus_per_replica": 1},
              "failure_policy": {"capacity_timeout": "8s", "capacity_retries": 1}}
    experiment = server.submit(config, _paced_context(tmp_path))
    queued = server.wait_trial(experiment, lambda t: "waiting for Ray" in (t["queue_reason"]
                                                                          or ""),
                               timeout=60, what="Ray's reason in the queue")
    assert queued["state"] == "QUEUED"
    assert "3 bundle(s)" in queued["queue_reason"] and "GPU" in queued["queue_reason"]
    trial = server.wait_trial(experiment, _ended, timeout=120, what="the CAPACITY failure")
    assert (trial["state"], trial["reason"]) == ("FAILED", "CAPACITY"), trial
    assert "2 waits of 8 s" in trial["message"], trial["message"]
    assert trial["attempts"] == []  # nothing was ever launched
    _assert_nothing_left(server, trial["uuid"])


def test_a_replica_with_a_gpu_sees_the_one_ray_assigned_it(
    server: RayServer, tmp_path: Path
) -> None:
    context = tmp_path / "context"
    context.mkdir()
    (context / "show.py").write_text(
        "import os\nprint('CUDA_VISIBLE_DEVICES=' + os.environ.get('CUDA_VISIBLE_DEVICES', "
        "'(unset)'), flush=True)\n")
    config = {"name": "gpu-on-ray", "entrypoint": "python show.py",
              "resources": {"replicas": 1, "gpus_per_replica": 1},
              "verify": {"require_checkpoint": False}}
    experiment = server.submit(config, context)
    trial = server.wait_trial(experiment, _ended, timeout=120, what="the GPU trial")
    assert (trial["state"], trial["reason"]) == ("SUCCEEDED", "OK"), trial
    (replica,) = _replicas(trial)
    assert _ray_nodes(server)[replica["node"]]["gpus"] == 1  # the node with the GPU
    assert _log(server, trial["id"]) == "CUDA_VISIBLE_DEVICES=0\n"
    _assert_nothing_left(server, trial["uuid"])


def _log(server: RayServer, trial_id: int, rank: int = 0, attempt: int | None = None) -> str:
    args = ["trial", "logs", str(trial_id), "--rank", str(rank)]
    if attempt is not None:
        args += ["--attempt", str(attempt)]
    return server.cli(*args).stdout


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _assert_nothing_left(server: RayServer, trial_uuid: str) -> None:
    """No placement group or named actor of the trial is left on the cluster."""
    script = f"""
        import json, ray
        ray.init(namespace="muster", log_to_driver=False)
        groups = [g["name"] for g in ray.util.placement_group_table().values()
                  if g["name"].startswith("muster:{trial_uuid}") and g["state"] != "REMOVED"]
        actors = [a for a in ray.util.list_named_actors() if a.startswith("muster:{trial_uuid}")]
        print(json.dumps({{"groups": groups, "actors": actors}}))
    """

    def clean() -> bool:
        found: dict[str, list[str]] = server.ray(script)
        return found == {"groups": [], "actors": []}

    wait_until(clean, timeout=60, what=f"no group or actor of trial {trial_uuid} on Ray")
