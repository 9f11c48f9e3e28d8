"""resources.distributed_env with real processes: nanoGPT-style code (DDP whenever RANK is
set) runs single-process on one replica, gets torchrun's variables when asked or when it has
several replicas, and a torchrun entrypoint gets them on one; without them the harness keeps
each replica's own rank."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed
import yaml
from sqlalchemy import select

from muster.rundir import RankFiles
from muster.services.experiments import create_experiment
from muster.store import Replica, Trial
from tests.supervise.conftest import Rig, Submitted, TrialView, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

UNSET = ("RANK=unset LOCAL_RANK=unset WORLD_SIZE=unset LOCAL_WORLD_SIZE=unset "
         "MASTER_ADDR=unset MASTER_PORT=unset")
HARNESS_SCRIPT = """\
import os, muster.harness as mh
with mh.init() as ctx:
    print(f"harness rank {ctx.rank} of {ctx.world_size}, RANK={os.environ.get('RANK')}",
          flush=True)
    ctx.report_training(1, {"loss": 0.5})
"""


def submit(rig: Rig, entrypoint: list[str], **resources: Any) -> Submitted:
    config = {"name": "distributed-env", "entrypoint": entrypoint, "resources": resources,
              "failure_policy": {"stop_grace": 1.0}, "verify": {"require_checkpoint": False}}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def logs(rig: Rig, trial: TrialView) -> list[str]:
    """The rank logs of the trial's last attempt, rank 0 first."""
    with rig.store.session_scope() as s:
        paths = s.scalars(select(Replica.log_path).where(
            Replica.attempt_id == trial.attempts[-1].id).order_by(Replica.rank))
        return [Path(path).read_text() for path in paths]


def nanogpt(*args: str) -> list[str]:
    return fixture_entrypoint("nanogpt_ddp.py", *args)


def test_nanogpt_style_code_runs_single_process_on_one_replica(rig: Rig) -> None:
    """Issue 31: with RANK set, unmodified nanoGPT took its DDP+NCCL path and failed on CPU."""
    trial = rig.run_to_end(submit(rig, nanogpt()))
    [log] = logs(rig, trial)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK"), log
    assert log.splitlines() == ["single process",
                                f"saw {UNSET} MUSTER_RANK=0 MUSTER_WORLD_SIZE=1"]


@pytest.mark.skipif(torch.distributed.is_nccl_available(), reason="this torch has NCCL")
def test_always_brings_back_the_ddp_path_and_its_nccl_failure(sqlite_rig: Rig) -> None:
    trial = sqlite_rig.run_to_end(submit(sqlite_rig, nanogpt(), distributed_env="always"))
    assert (trial.state, trial.reason) == ("FAILED", "USER_ERROR")
    assert trial.message is not None and "NCCL" in trial.message


def test_always_gives_one_replica_a_world_of_one(sqlite_rig: Rig) -> None:
    trial = sqlite_rig.run_to_end(submit(sqlite_rig, nanogpt("gloo"), distributed_env="always"))
    [log] = logs(sqlite_rig, trial)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK"), log
    assert log.startswith("ddp rank 0 of 1 (local 0), ranks sum to 0\nsaw RANK=0 LOCAL_RANK=0 "
                          "WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=")


def test_two_replicas_get_them_and_meet(sqlite_rig: Rig) -> None:
    trial = sqlite_rig.run_to_end(submit(sqlite_rig, nanogpt("gloo"), replicas=2))
    found = logs(sqlite_rig, trial)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK"), found
    assert [log.splitlines()[0] for log in found] == [
        f"ddp rank {rank} of 2 (local {rank}), ranks sum to 1" for rank in (0, 1)]


def test_never_leaves_them_out_and_the_harness_keeps_each_replica_s_rank(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    script = tmp_path / "harness_ranks.py"
    script.write_text(HARNESS_SCRIPT)
    trial = sqlite_rig.run_to_end(submit(sqlite_rig, [sys.executable, str(script)],
                                         replicas=2, distributed_env="never"))
    found = logs(sqlite_rig, trial)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK"), found
    assert [log.splitlines()[0] for log in found] == [
        f"harness rank {rank} of 2, RANK=None" for rank in (0, 1)]
    run_dir = trial.attempts[0].run_dir
    assert all(RankFiles(run_dir, rank).metrics.stat().st_size for rank in (0, 1))


def test_a_torchrun_entrypoint_gets_them_on_one_replica(sqlite_rig: Rig) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    entrypoint = [torchrun, "--standalone", "--nproc-per-node", "2",
                  *fixture_entrypoint("nanogpt_ddp.py", "gloo")[1:]]
    trial = sqlite_rig.run_to_end(submit(sqlite_rig, entrypoint))
    [log] = logs(sqlite_rig, trial)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK"), log
    # Both processes print to torchrun's one pipe, unbuffered: a line's text and its newline
    # are two writes, so the other process's line can land between them.
    for rank in (0, 1):
        assert f"ddp rank {rank} of 2 (local {rank}), ranks sum to 1" in log, log
    spec = json.loads(RankFiles(trial.attempts[0].run_dir, 0).spec.read_text())
    assert (spec["distributed"], spec["env"]["RANK"], spec["env"]["MASTER_ADDR"]) == (
        True, "0", "127.0.0.1")
