"""The job-environment contract: what the platform writes, the harness reads back the same
(a table of jobs), and a malformed or missing variable is named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from muster.jobenv import (
    DETERMINISTIC_VARIABLES,
    Distributed,
    JobEnvironment,
    build_env,
    job_umask,
)

RUN = Path("/home/runs/trial-uuid")
BASE = JobEnvironment(run_dir=RUN, trial_id=7, attempt=2, hparams_path=RUN / "hparams.json")


def job(**changes: Any) -> JobEnvironment:
    return replace(BASE, **changes)


@pytest.mark.parametrize("original", [
    pytest.param(BASE, id="single process"),
    pytest.param(job(rank=1, world_size=4,
                     distributed=Distributed.on_one_node(1, 4, "127.0.0.1", 29500)),
                 id="DDP rank"),
    pytest.param(job(rank=3, world_size=4,
                     distributed=Distributed(rank=3, world_size=4, local_rank=1,
                                             local_world_size=2, master_addr="10.0.0.2",
                                             master_port=41000, group_rank=1)),
                 id="DDP rank placed by Ray"),
    pytest.param(job(rank=1, world_size=2), id="distributed_env never"),
    pytest.param(job(distributed=Distributed.on_one_node(0, 1, "127.0.0.1", 29500)),
                 id="distributed_env always"),
    pytest.param(job(standby_go=RUN / "attempt-2" / "rank-0.go",
                     latest_checkpoint=RUN / "checkpoints" / "step-10"), id="standby, resume"),
    pytest.param(job(gpus=()), id="no GPUs on a GPU server"),
    pytest.param(job(gpus=(2, 3)), id="two GPUs"),
    pytest.param(job(heartbeat_timeout=300.0, max_length=64, seed=1234, deterministic=True,
                     diagnostics_interval=None, distributed_debug=True, incarnation=2),
                 id="config settings"),
    pytest.param(job(heartbeat_timeout=0.1, diagnostics_interval=5),
                 id="a timeout :g would round"),
    pytest.param(job(flight_recorder=RUN / "attempt-2" / "rank-0.flight-",
                     virtual_env=RUN / "env"), id="flight recorder, environment layer"),
    pytest.param(JobEnvironment(run_dir=RUN), id="only the run directory"),
    pytest.param(job(experiment_id=3, integrations=True, compat="determined"),
                 id="experiment, integrations, Determined's Core API"),
])
def test_what_the_platform_writes_reads_back_the_same(original: JobEnvironment) -> None:
    assert JobEnvironment.from_environ(original.to_environ()) == original


def test_variables_it_does_not_know_are_ignored() -> None:
    environ = {**BASE.to_environ(), "HOME": "/root", "OMP_NUM_THREADS": "2"}
    assert JobEnvironment.from_environ(environ) == BASE


@pytest.mark.parametrize("visible", ["GPU-5d3e0c6a-1f2b", "-1", "0,GPU-1"])
def test_devices_muster_did_not_number_are_not_its_gpus(visible: str) -> None:
    """A server that schedules no GPUs passes its own CUDA_VISIBLE_DEVICES on."""
    environ = {**BASE.to_environ(), "CUDA_VISIBLE_DEVICES": visible}
    assert JobEnvironment.from_environ(environ).gpus is None


def test_the_process_rank_is_torchrun_s_where_set() -> None:
    """A torchrun entrypoint's workers have their own RANK over the MUSTER_RANK they
    inherited; without torchrun's variables each replica keeps muster's."""
    worker = {**job(rank=0, world_size=1).to_environ(), "RANK": "3", "WORLD_SIZE": "4"}
    assert JobEnvironment.from_environ(worker).process_rank() == (3, 4)
    assert job(rank=1, world_size=2).process_rank() == (1, 2)


def test_muster_s_variables_win_over_the_config_s() -> None:
    """A config cannot fake its rank, even with determinism on; it keeps the determinism
    switches and the dump files it names itself."""
    env = build_env({"RANK": "7", "MUSTER_RANK": "5", "PYTHONHASHSEED": "42",
                     "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "/data/fr-"},
                    job(rank=1, world_size=2, deterministic=True,
                        flight_recorder=RUN / "fr-",
                        distributed=Distributed.on_one_node(1, 2, "127.0.0.1", 29500)))
    assert (env["RANK"], env["MUSTER_RANK"]) == ("1", "1")
    assert env["PYTHONHASHSEED"] == "42"
    assert env["CUBLAS_WORKSPACE_CONFIG"] == DETERMINISTIC_VARIABLES["CUBLAS_WORKSPACE_CONFIG"]
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/data/fr-"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(RUN / "fr-")


@pytest.mark.parametrize(("text", "umask"), [(None, None), ("0022", 0o022), ("7777", 0o777),
                                             ("u=rwx", None)])
def test_the_job_s_umask(text: str | None, umask: int | None) -> None:
    inherited = {} if text is None else {"MUSTER_JOB_UMASK": text}
    assert job_umask(inherited) == umask


def test_without_a_run_directory_it_is_no_job() -> None:
    with pytest.raises(ValueError, match="MUSTER_RUN_DIR is not set"):
        JobEnvironment.from_environ({"MUSTER_TRIAL_ID": "7"})


@pytest.mark.parametrize(("variables", "message"), [
    ({"MUSTER_TRIAL_ID": "x"}, "MUSTER_TRIAL_ID must be an integer, got 'x'"),
    ({"MUSTER_ATTEMPT": "0"}, "MUSTER_ATTEMPT must be at least 1, got 0"),
    ({"MUSTER_REPLICA_RESTART": "-1"}, "MUSTER_REPLICA_RESTART must be at least 0, got -1"),
    ({"MUSTER_RANK": "one"}, "MUSTER_RANK must be an integer, got 'one'"),
    ({"MUSTER_WORLD_SIZE": "0"}, "MUSTER_WORLD_SIZE must be at least 1, got 0"),
    ({"MUSTER_RANK": "2", "MUSTER_WORLD_SIZE": "2"},
     "MUSTER_RANK=2 must be smaller than MUSTER_WORLD_SIZE=2"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be smaller than WORLD_SIZE=2"),
    ({"RANK": "0", "LOCAL_RANK": "x"}, "LOCAL_RANK must be an integer, got 'x'"),
    ({"RANK": "0", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE must be at least 1, got 0"),
    ({"RANK": "0", "MASTER_PORT": "http"}, "MASTER_PORT must be an integer, got 'http'"),
    ({"RANK": "0", "GROUP_RANK": "-2"}, "GROUP_RANK must be at least 0, got -2"),
    ({"MUSTER_HEARTBEAT_TIMEOUT": "soon"},
     "MUSTER_HEARTBEAT_TIMEOUT must be a number of seconds like '300', got 'soon'"),
    ({"MUSTER_HEARTBEAT_TIMEOUT": "-5"}, "MUSTER_HEARTBEAT_TIMEOUT must be positive, got '-5'"),
    ({"MUSTER_MAX_LENGTH": "0"}, "MUSTER_MAX_LENGTH must be at least 1, got 0"),
    ({"MUSTER_SEED": "1.5"}, "MUSTER_SEED must be an integer, got '1.5'"),
    ({"MUSTER_DIAGNOSTICS": "sometimes"},
     "MUSTER_DIAGNOSTICS must be 'off' or a positive number of optimizer steps, "
     "got 'sometimes'"),
])
def test_a_malformed_variable_is_named(variables: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        JobEnvironment.from_environ({"MUSTER_RUN_DIR": str(RUN), **variables})
    assert str(raised.value) == message
