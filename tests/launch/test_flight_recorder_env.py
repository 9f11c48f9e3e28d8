"""A job that turns torch's flight recorder on gets its dumps into the attempt's directory
(where a stall's evidence bundle collects them); one that names a path keeps it; one that
does not record gets no such variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.jobenv import Distributed, JobEnvironment, build_env
from muster.rundir import RankFiles


def context(tmp_path: Path) -> JobEnvironment:
    return JobEnvironment(run_dir=tmp_path, trial_id=1, attempt=1, rank=1, world_size=2,
                          distributed=Distributed.on_one_node(1, 2, "127.0.0.1", 29500),
                          hparams_path=tmp_path / "hparams.json",
                          flight_recorder=RankFiles(tmp_path, 1).flight_recorder)


@pytest.mark.parametrize("buffer", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_a_recording_job_dumps_into_its_attempt(tmp_path: Path, buffer: str) -> None:
    env = build_env({buffer: "2000"}, context(tmp_path))
    prefix = str(tmp_path / "rank-1.flight-")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix


def test_a_path_the_job_names_wins(tmp_path: Path) -> None:
    env = build_env({"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "/data/fr-"},
                    context(tmp_path))
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/data/fr-"


@pytest.mark.parametrize("variables", [{}, {"TORCH_FR_BUFFER_SIZE": "0"}])
def test_a_job_that_does_not_record_gets_nothing(tmp_path: Path,
                                                 variables: dict[str, str]) -> None:
    env = build_env(variables, context(tmp_path))
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env
