"""The pure launch plan of an attempt: one spec per rank, with what each replica must see."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from muster.config import load_config
from muster.jobenv import STANDBY_GO, TORCHRUN_VARIABLES, job_environment
from muster.rundir import RunDir
from muster.supervise.launching import AttemptPlan, replica_specs

RUN = RunDir(Path("/home/runs/trial-uuid"))
CONFIG = """\
name: plan
entrypoint: python train.py --epochs 3
environment: {variables: {OMP_NUM_THREADS: "2", RANK: "7"}}
resources: {replicas: 2, memory_limit: 1GiB}
failure_policy: {stop_grace: 5s, heartbeat_timeout: 60s}
"""
ENVIRON = {"PATH": "/usr/bin", "HOME": "/root", "MUSTER_SEED": "stale",
           "CUDA_VISIBLE_DEVICES": "0,1,2,3", "MUSTER_HOME": "/srv/muster",
           "MUSTER_DB": "postgresql://muster:pw@db/muster"}


def plan(**changes: object) -> AttemptPlan:
    facts: dict[str, object] = dict(
        trial_id=7, trial_uuid="trial-uuid", trial_number=3, number=2, dir=RUN.attempt(2),
        config=load_config(CONFIG), workdir=RUN.workdir,
        master_port=29500, latest_checkpoint=None, gpus=None, seed=None)
    facts.update(changes)
    return AttemptPlan(**facts)  # type: ignore[arg-type]


def test_one_spec_per_rank_with_the_torchrun_environment() -> None:
    specs = replica_specs(plan())
    assert [s.rank for s in specs] == [0, 1]
    for spec in specs:
        assert spec.argv == ["python", "train.py", "--epochs", "3"]
        assert spec.cwd == RUN.workdir  # the trial's own copy of the context
        assert spec.attempt_dir == RUN.attempt(2).path
        assert (spec.trial_uuid, spec.attempt, spec.stop_grace) == ("trial-uuid", 2, 5.0)
        assert spec.memory_limit == 1 << 30
        assert "HOME" not in spec.env and "PATH" not in spec.env  # the job's own variables only
        env = job_environment(ENVIRON, spec.env)
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(spec.rank), str(spec.rank))
        assert (env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
            "2", "127.0.0.1", "29500")
        # one node, as torchrun says of one: node 0 of 1
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert (env["MUSTER_RANK"], env["MUSTER_WORLD_SIZE"]) == (str(spec.rank), "2")
        assert spec.distributed
        assert env["MUSTER_RUN_DIR"] == str(RUN.path)
        assert env["MUSTER_HPARAMS"] == str(RUN.attempt(2).hparams)
        assert (env["MUSTER_TRIAL_ID"], env["MUSTER_ATTEMPT"]) == ("7", "2")
        assert env["MUSTER_HEARTBEAT_TIMEOUT"] == "60"
        assert env["OMP_NUM_THREADS"] == "2" and env["HOME"] == "/root"
        assert "MUSTER_SEED" not in env and "MUSTER_LATEST_CHECKPOINT" not in env
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # muster schedules no GPUs here
        assert STANDBY_GO not in env


@pytest.mark.parametrize(("gpus", "visible"), [
    # a distributed trial's ranks see every rank's GPUs in rank order, as under torchrun:
    # device LOCAL_RANK is the rank's own (GPUs 3 and 2 given to ranks 0 and 1)
    ({0: (3,), 1: (2,)}, ["3,2", "3,2"]),
    ({0: (4, 5), 1: (0, 1)}, ["4,5,0,1", "4,5,0,1"]),
    ({}, ["", ""]),
])
def test_a_distributed_trials_ranks_see_its_gpus_in_rank_order(
        gpus: dict[int, tuple[int, ...]], visible: list[str]) -> None:
    specs = replica_specs(plan(gpus=gpus))
    assert [s.env["LOCAL_RANK"] for s in specs] == ["0", "1"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == visible
    assert {s.env["CUDA_DEVICE_ORDER"] for s in specs} == {"PCI_BUS_ID"}


@pytest.mark.parametrize(("gpus", "visible"), [
    ({0: (2,), 1: (3,)}, ["2", "3"]),
    ({0: (0, 1)}, ["0,1", ""]),  # a rank without GPUs sees none
])
def test_replicas_without_torchruns_variables_see_exactly_their_own(
        gpus: dict[int, tuple[int, ...]], visible: list[str]) -> None:
    config = load_config(CONFIG.replace("memory_limit: 1GiB", "memory_limit: 1GiB, "
                                        "distributed_env: never"))
    specs = replica_specs(plan(gpus=gpus, config=config))
    assert not any("LOCAL_RANK" in s.env for s in specs)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == visible


def test_resume_seed_restart_and_standby() -> None:
    latest = RUN.checkpoints / "step-000000000010-abcdef12"
    [spec] = replica_specs(plan(latest_checkpoint=latest, seed=1234, incarnation=2,
                                standby=True), ranks=[1])
    assert spec.rank == 1
    assert spec.env["MUSTER_LATEST_CHECKPOINT"] == str(latest)
    assert spec.env["MUSTER_SEED"] == "1234"
    assert spec.env["MUSTER_REPLICA_RESTART"] == "2"
    assert spec.env[STANDBY_GO] == str(RUN.attempt(2).rank(1).standby_go)


def test_the_job_gets_no_server_setting_and_python_first() -> None:
    """The server's MUSTER_HOME and MUSTER_DB (a database password) never reach a job; the
    inherited rest does, with the interpreter muster runs on first on PATH."""
    env = job_environment(ENVIRON, {"OMP_NUM_THREADS": "2", "MUSTER_RUN_DIR": "/r"})
    assert not {"MUSTER_HOME", "MUSTER_DB", "MUSTER_SEED"} & env.keys()
    assert (env["HOME"], env["MUSTER_RUN_DIR"], env["OMP_NUM_THREADS"]) == ("/root", "/r", "2")
    assert env["PATH"] == f"{Path(sys.executable).parent}:/usr/bin"


def test_secrets_join_the_job_s_variables() -> None:
    [spec, _] = replica_specs(plan(secrets={"TOKEN": "s3cr3t"}))
    assert spec.env["TOKEN"] == "s3cr3t" and spec.env["OMP_NUM_THREADS"] == "2"


def config_of(replicas: int, entrypoint: str = "python train.py", setting: str = "") -> str:
    written = f", distributed_env: {setting}" if setting else ""
    return f"name: plan\nentrypoint: {entrypoint}\nresources: {{replicas: {replicas}{written}}}\n"


def test_one_replica_gets_muster_s_rank_and_no_torchrun_variables() -> None:
    """nanoGPT takes its DDP path whenever RANK is set: one replica is not distributed."""
    [spec] = replica_specs(plan(config=load_config(config_of(1))))
    assert not TORCHRUN_VARIABLES & spec.env.keys() and not spec.distributed
    assert (spec.env["MUSTER_RANK"], spec.env["MUSTER_WORLD_SIZE"]) == ("0", "1")
    env = job_environment({**ENVIRON, "RANK": "3", "MASTER_PORT": "1"}, spec.env)
    assert not TORCHRUN_VARIABLES & env.keys()  # nor from the server's own environment


@pytest.mark.parametrize(("replicas", "entrypoint", "setting", "distributed"), [
    (1, "torchrun --standalone --nproc-per-node 2 train.py", "", True),
    (1, "python -m torch.distributed.run train.py", "", True),
    (1, "python train.py", "always", True),
    (2, "python train.py", "never", False),
    (1, "torchrun train.py", "never", False),
])
def test_the_setting_and_the_entrypoint_decide(replicas: int, entrypoint: str, setting: str,
                                               distributed: bool) -> None:
    specs = replica_specs(plan(config=load_config(config_of(replicas, entrypoint, setting))))
    for spec in specs:
        assert spec.distributed is distributed
        assert (spec.env.keys() >= TORCHRUN_VARIABLES) is distributed
        assert not distributed or spec.env["RANK"] == str(spec.rank)
        assert spec.env["MUSTER_RANK"] == str(spec.rank)
        assert spec.env["MUSTER_WORLD_SIZE"] == str(replicas)
