"""A search that cannot work says so (issue 12, item 7): one whose first trials all fail
with PERMANENT_ERROR stops drawing and ends ERROR with their common message; one whose
metric no trial reports gets a warning the experiment shows."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.config.loading import load_config
from muster.services.experiments import create_experiment, describe_experiment
from muster.store import Event, Experiment, Trial
from muster.supervise.searching import streak_of_permanent_errors
from tests.supervise.conftest import Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def _search(rig: Rig, code: str, values: int, **searcher: Any) -> int:
    config = {"name": "search", "entrypoint": [sys.executable, "-c", code],
              "failure_policy": {"stop_grace": 1.0},
              "hyperparameters": {"x": {"type": "int", "minval": 1, "maxval": values}},
              "searcher": {"name": "grid", "metric": "loss", **searcher}}
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config), archive=None)


def _ended(rig: Rig, experiment_id: int) -> dict[str, Any]:
    rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                   what=f"experiment {experiment_id} to end")
    return describe_experiment(rig.store, experiment_id)


def test_a_search_whose_first_trials_all_fail_alike_stops(sqlite_rig: Rig) -> None:
    experiment_id = _search(sqlite_rig, "import no_such_module", 20, max_concurrent_trials=2)
    exp = _ended(sqlite_rig, experiment_id)
    drawn = len(exp["trials"])
    # the first 3 to end, and at most one more drawn while they ran (2 run at a time)
    assert 3 <= drawn <= 4 < 20
    assert {(t["state"], t["reason"]) for t in exp["trials"]} == {("FAILED", "PERMANENT_ERROR")}
    assert exp["state"] == "ERROR"
    assert exp["message"].startswith("the first 3 trials all failed with PERMANENT_ERROR and "
                                     "none succeeded, so the search draws no more; all with: ")
    assert "ModuleNotFoundError: No module named 'no_such_module'" in exp["message"]
    assert exp["warnings"] == [exp["message"]]
    with sqlite_rig.store.session_scope() as s:
        stopped = s.scalars(select(Event).where(Event.experiment_id == experiment_id,
                                                Event.reason == "search stopped")).all()
        assert len(stopped) == 1  # noted once, however many passes look


def test_a_search_with_one_success_goes_on(sqlite_rig: Rig, tmp_path: Path) -> None:
    """Failing trials after a success are the search's business: it runs every point."""
    first = tmp_path / "first-ran"
    experiment_id = _search(sqlite_rig, "import pathlib, sys\n"
                            f"first = pathlib.Path({str(first)!r})\n"
                            "ran = first.exists()\nfirst.touch()\nsys.exit(2 if ran else 0)\n",
                            5, max_concurrent_trials=1)
    exp = _ended(sqlite_rig, experiment_id)
    assert exp["state"] == "COMPLETED" and len(exp["trials"]) == 5
    assert sorted(t["state"] for t in exp["trials"]) == ["FAILED"] * 4 + ["SUCCEEDED"]


@pytest.mark.parametrize("concurrent", [1, 16])  # drawn one by one; all drawn at once
def test_a_metric_no_trial_reports_is_a_warning(sqlite_rig: Rig, concurrent: int) -> None:
    experiment_id = _search(sqlite_rig, "print('trained')", 2, max_concurrent_trials=concurrent)
    exp = _ended(sqlite_rig, experiment_id)
    assert exp["state"] == "COMPLETED"
    [warning] = exp["warnings"]
    assert warning.startswith("none of the ") and "reported the searcher's metric 'loss'" in (
        warning)
    assert "check searcher.metric against the names the script passes to report_validation" in (
        warning)
    with sqlite_rig.store.session_scope() as s:
        assert s.get_one(Experiment, experiment_id).state == "COMPLETED"


def _trial(number: int, state: str, ended_at: float | None = None) -> Trial:
    return Trial(number=number, state=state, ended_at=ended_at,
                 reason="PERMANENT_ERROR" if state == "FAILED" else None)


def test_the_streak_is_of_the_first_trials_to_end_not_the_lowest_numbers() -> None:
    """A slow trial 2 does not let 3, 4, 5 ... fail one by one, each freeing a slot."""
    config = load_config(yaml.safe_dump({
        "name": "s", "entrypoint": ["true"], "hyperparameters": {"x": {"type": "int",
                                                                      "minval": 1, "maxval": 9}},
        "searcher": {"name": "grid", "metric": "loss", "max_concurrent_trials": 2}}))
    slow = [_trial(0, "FAILED", 1.0), _trial(1, "FAILED", 2.0), _trial(2, "RUNNING"),
            _trial(3, "FAILED", 3.0)]
    assert [t.number for t in streak_of_permanent_errors(slow, config) or []] == [0, 1, 3]
    assert streak_of_permanent_errors(slow[:2] + slow[2:3], config) is None  # only 2 ended
    ok = [*slow, _trial(4, "SUCCEEDED", 4.0)]
    assert streak_of_permanent_errors(ok, config) is None  # a success: the search goes on
    mixed = [_trial(0, "FAILED", 1.0), _trial(1, "SUCCEEDED", 0.5), _trial(2, "FAILED", 2.0)]
    assert streak_of_permanent_errors(mixed, config) is None
