"""Reading the environment muster sets: a table of environments and what they mean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from muster.harness.run import read_run
from tests.harness.conftest import HPARAMS, Platform


def test_without_muster_run_dir_it_is_a_local_run(tmp_path: Path) -> None:
    env = read_run({}, tmp_path, {"lr": 0.1})
    assert env.run_dir == tmp_path / "muster-run"
    assert (env.trial_id, env.attempt, env.rank, env.world_size) == (None, 1, 0, 1)
    assert env.hparams == {"lr": 0.1}
    assert env.latest_checkpoint is None
    assert read_run({}, tmp_path).hparams == {}


def test_a_local_run_under_torchrun_keeps_its_rank(tmp_path: Path) -> None:
    env = read_run({"RANK": "1", "WORLD_SIZE": "2"}, tmp_path)
    assert (env.rank, env.world_size, env.attempt) == (1, 2, 1)


def test_on_the_platform_every_variable_is_read(platform: Platform, tmp_path: Path) -> None:
    latest = tmp_path / "ckpt"
    env = read_run(
        {**platform.env, "MUSTER_LATEST_CHECKPOINT": str(latest),
         "MUSTER_HEARTBEAT_TIMEOUT": "300"},
        tmp_path, {"ignored": True},
    )
    assert env.run_dir == platform.run_dir
    assert (env.trial_id, env.attempt, env.rank, env.world_size) == (7, 2, 1, 2)
    assert env.hparams == HPARAMS  # the trial's own, never the local defaults
    assert env.latest_checkpoint == latest
    assert env.heartbeat_timeout == 300.0


@pytest.mark.parametrize(("variables", "rank", "world_size"), [
    ({"MUSTER_RANK": "1", "MUSTER_WORLD_SIZE": "2"}, 1, 2),  # distributed_env: never
    ({"MUSTER_RANK": "0", "MUSTER_WORLD_SIZE": "1"}, 0, 1),  # one replica, auto
    ({"MUSTER_RANK": "0", "MUSTER_WORLD_SIZE": "1", "RANK": "1", "WORLD_SIZE": "2"}, 1, 2),
    ({"MUSTER_RANK": "1", "MUSTER_WORLD_SIZE": "2", "RANK": "1", "WORLD_SIZE": "2"}, 1, 2),
])
def test_muster_s_rank_serves_where_torchrun_s_is_not_set(
    platform: Platform, tmp_path: Path, variables: dict[str, str], rank: int, world_size: int
) -> None:
    """Without torchrun's variables (`resources.distributed_env`) each replica keeps its
    own rank's files; a torchrun entrypoint's processes have their own RANK, which wins
    over the MUSTER_RANK they inherited."""
    environ = {name: value for name, value in platform.env.items()
               if name not in ("RANK", "WORLD_SIZE")}
    env = read_run({**environ, **variables}, tmp_path)
    assert (env.rank, env.world_size) == (rank, world_size)


@pytest.mark.parametrize(
    ("timeout", "interval"), [(None, 10.0), ("300", 10.0), ("9", 3.0), ("1.5s", 0.5)]
)
def test_heartbeat_interval_is_10_s_or_a_third_of_the_timeout(
    tmp_path: Path, timeout: str | None, interval: float
) -> None:
    variables = {} if timeout is None else {"MUSTER_HEARTBEAT_TIMEOUT": timeout}
    assert read_run(variables, tmp_path).heartbeat_interval() == pytest.approx(interval)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"RANK": "one"}, "RANK must be an integer, got 'one'"),
        ({"RANK": "-1"}, "RANK must be at least 0"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be smaller than WORLD_SIZE=2"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE must be at least 1"),
        ({"MUSTER_RANK": "2", "MUSTER_WORLD_SIZE": "2"},
         "MUSTER_RANK=2 must be smaller than MUSTER_WORLD_SIZE=2"),
        ({"MUSTER_RUN_DIR": "/r", "MUSTER_ATTEMPT": "0"}, "MUSTER_ATTEMPT must be at least 1"),
        ({"MUSTER_RUN_DIR": "/r", "MUSTER_TRIAL_ID": "x"}, "MUSTER_TRIAL_ID must be an integer"),
        ({"MUSTER_HEARTBEAT_TIMEOUT": "soon"}, "MUSTER_HEARTBEAT_TIMEOUT must be a number"),
        ({"MUSTER_HEARTBEAT_TIMEOUT": "0"}, "MUSTER_HEARTBEAT_TIMEOUT must be positive"),
        ({"MUSTER_RUN_DIR": "/r", "MUSTER_HPARAMS": "/no/such/file.json"},
         "could not read the hyperparameters in MUSTER_HPARAMS=/no/such/file.json"),
    ],
)
def test_a_malformed_variable_is_named(
    tmp_path: Path, variables: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        read_run(variables, tmp_path)


def test_hparams_must_be_a_json_object(tmp_path: Path) -> None:
    path = tmp_path / "hparams.json"
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        read_run({"MUSTER_RUN_DIR": str(tmp_path), "MUSTER_HPARAMS": str(path)},
                         tmp_path)
