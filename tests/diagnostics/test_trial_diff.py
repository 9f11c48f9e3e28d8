"""`muster trial diff` on real trials: each rank's harness writes its snapshot; two trials
of the same config diff to nothing, and one variable changed shows in the config and in
what every rank saw."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.services.experiments import create_experiment
from muster.services.snapshots import diff_trials, trial_snapshot
from muster.store import Trial
from tests.supervise.conftest import FIXTURES, Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def _run(rig: Rig, variables: dict[str, str], replicas: int = 1) -> int:
    config: dict[str, Any] = {
        "name": "snap", "harness": True,
        "entrypoint": [sys.executable, str(FIXTURES / "checkpoint_series.py"), "0.5"],
        "failure_policy": {"stop_grace": 1.0}, "environment": {"variables": variables},
        "resources": {"replicas": replicas}}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    assert rig.run_to_end_of(experiment_id, trial_id).state == "SUCCEEDED"
    return trial_id


def test_each_rank_records_what_it_is_made_of(sqlite_rig: Rig) -> None:
    trial_id = _run(sqlite_rig, {"OMP_NUM_THREADS": "1"}, replicas=2)
    snapshot = trial_snapshot(sqlite_rig.store, sqlite_rig.home, trial_id)
    assert set(snapshot["ranks"]) == {"0", "1"}
    rank = snapshot["ranks"]["1"]
    assert rank["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert rank["variables"]["OMP_NUM_THREADS"] == "1"
    assert rank["frameworks"]["cuda"] is None and rank["gpus"] == []
    part = snapshot["trial"]
    assert part["config"]["environment"]["variables"] == {"OMP_NUM_THREADS": "1"}
    assert len(part["code"]["tree_sha256"]) == 64 and part["code"]["files"] == 0
    json.dumps(snapshot)  # what the API returns


def test_the_same_config_diffs_to_nothing_and_a_variable_shows_where_it_acted(
        sqlite_rig: Rig) -> None:
    first = _run(sqlite_rig, {"OMP_NUM_THREADS": "1"})
    same = _run(sqlite_rig, {"OMP_NUM_THREADS": "1"})
    other = _run(sqlite_rig, {"OMP_NUM_THREADS": "4"})
    assert diff_trials(sqlite_rig.store, sqlite_rig.home, first, same) == {
        "differences": [], "lines": []}
    found = diff_trials(sqlite_rig.store, sqlite_rig.home, first, other)
    assert [(d["group"], d["field"], d["a"], d["b"], d["rank"]) for d in found["differences"]] == [
        ("config", "config.environment.variables.OMP_NUM_THREADS", "1", "4", None),
        ("numerics", "variables.OMP_NUM_THREADS", "1", "4", 0)]
    assert found["lines"][1] == "OMP_NUM_THREADS: 1 vs 4 (rank 0)"
