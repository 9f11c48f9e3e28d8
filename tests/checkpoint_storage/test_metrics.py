"""A checkpoint's metric is the validation it was saved after (issue 30, item 11): the rule
table-tested and checked against a plain scan, the step-unit check likewise, and both on a
real run that validates per epoch and saves per optimizer step, through GC."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from muster.checkpoint_storage.metrics import Mark, attribute_metrics, step_scale_conflict
from muster.checkpoint_storage.worker import StorageWorker
from muster.services.experiments import create_experiment
from muster.services.retention import trial_checkpoints
from muster.store import Event, Trial
from tests.checkpoint_storage.test_worker import _drain
from tests.supervise.conftest import FIXTURES, Rig

V = tuple[Mark, float]


def val(attempt: int, time: float, step: int, value: float = 0.0) -> V:
    return Mark(attempt, time, step), value


# --- attribute_metrics ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoints", "validations", "expected"),
    [
        pytest.param(
            {10: Mark(1, 2.0, 45), 11: Mark(1, 4.0, 90), 12: Mark(1, 6.0, 135)},
            [val(1, 1.0, 1, 0.5), val(1, 3.0, 2, 0.9), val(1, 5.0, 3, 0.7)],
            {10: (0.5, 1), 11: (0.9, 2), 12: (0.7, 3)},
            id="epoch-validation-step-checkpoints",
        ),
        pytest.param(
            {1: Mark(1, 2.0, 45)}, [val(1, 1.0, 1, 0.5), val(1, 3.0, 45, 0.99)],
            {1: (0.5, 1)}, id="an-equal-step-reported-later-does-not-count",
        ),
        pytest.param({1: Mark(1, 0.5, 5)}, [val(1, 1.0, 1, 0.5)], {}, id="saved-before-any"),
        pytest.param({1: Mark(1, 5.0, 5)}, [], {}, id="no-validations"),
        pytest.param(
            {1: Mark(2, 5.0, 30), 2: Mark(2, 7.0, 40)},
            [val(1, 1.0, 10, 0.1), val(1, 2.0, 20, 0.2), val(2, 6.0, 30, 0.3)],
            {2: (0.3, 30)}, id="only-its-own-attempt",
        ),
        pytest.param({1: Mark(1, 2.0, 7)}, [val(1, 2.0, 7, 0.4)], {1: (0.4, 7)},
                     id="the-same-time-is-before"),
        pytest.param(
            {1: Mark(1, 1.0, 3)}, [val(1, 1.0, 1, 0.1), val(1, 1.0, 2, 0.2)], {1: (0.2, 2)},
            id="a-tie-in-time-goes-to-the-last-reported",
        ),
        pytest.param(
            {1: Mark(1, 4.0, 9)}, [val(1, 5.0, 1, 0.1), val(1, 3.0, 2, 0.2)], {1: (0.2, 2)},
            id="a-clock-that-went-back",
        ),
        pytest.param({1: Mark(None, 5.0, 9), 2: Mark(1, None, 9)}, [val(1, 1.0, 1, 0.1)], {},
                     id="attempt-or-time-unknown"),
        pytest.param({1: Mark(1, 5.0, 9)}, [val(1, 1.0, 1, 0.1), val(1, 2.0, 2, -math.inf)],
                     {1: (-math.inf, 2)}, id="a-non-finite-value-is-its-value"),
    ],
)
def test_attribute_metrics(
    checkpoints: dict[int, Mark], validations: list[V], expected: dict[int, tuple[float, int]]
) -> None:
    assert attribute_metrics(checkpoints, validations) == expected


def test_a_checkpoint_saved_after_a_nan_validation_carries_the_nan() -> None:
    found = attribute_metrics({1: Mark(1, 5.0, 9)}, [val(1, 1.0, 1, 0.1), val(1, 2.0, 2, math.nan)])
    assert list(found) == [1] and math.isnan(found[1][0]) and found[1][1] == 2


marks = st.builds(Mark, st.sampled_from([1, 2, None]),
                  st.one_of(st.none(), st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0])),
                  st.integers(0, 6))
reports = st.builds(Mark, st.sampled_from([1, 2]), st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0]),
                    st.integers(0, 6))


@given(st.dictionaries(st.integers(0, 20), marks, max_size=8),
       st.lists(st.tuples(reports, st.integers(-5, 5).map(float)), max_size=12))
def test_attribute_metrics_matches_a_plain_scan(
    checkpoints: dict[int, Mark], validations: list[V]
) -> None:
    expected: dict[int, tuple[float, int]] = {}
    for checkpoint_id, saved in checkpoints.items():
        before = [i for i, (report, _) in enumerate(validations)
                  if saved.time is not None and report.attempt == saved.attempt
                  and report.time is not None and report.time <= saved.time]
        if before:
            report, value = validations[max(before)]
            expected[checkpoint_id] = (value, report.step)
    assert attribute_metrics(checkpoints, validations) == expected


# --- step_scale_conflict ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoints", "validations", "words"),
    [
        pytest.param(
            [Mark(1, 2.0, 45), Mark(1, 4.0, 90)], [Mark(1, 1.0, 1), Mark(1, 3.0, 2)],
            "in attempt 1 the validation of step 2 was reported after the checkpoint of step "
            "45 was saved", id="validation-in-epochs",
        ),
        pytest.param(
            [Mark(1, 2.0, 1)], [Mark(1, 1.0, 45)],
            "in attempt 1 the validation of step 45 was reported before the checkpoint of "
            "step 1 was saved", id="checkpoints-in-epochs",
        ),
        pytest.param([Mark(1, 2.0, 10), Mark(1, 4.0, 20)], [Mark(1, 1.0, 10), Mark(1, 3.0, 20)],
                     None, id="validate-then-save"),
        pytest.param([Mark(1, 1.0, 10), Mark(1, 3.0, 20)], [Mark(1, 2.0, 10), Mark(1, 4.0, 20)],
                     None, id="save-then-validate-the-same-step"),
        pytest.param([Mark(1, t, 50 * k) for k, t in ((1, 1.5), (2, 2.5), (3, 3.5))],
                     [Mark(1, 2.0, 100), Mark(1, 4.0, 200)], None,
                     id="validation-every-100-checkpoints-every-50"),
        pytest.param([Mark(1, 2.0, 20)], [Mark(1, 1.0, 20), Mark(2, 3.0, 10)], None,
                     id="a-new-attempt-starts-its-steps-again"),
        pytest.param([Mark(None, 2.0, 1), Mark(1, None, 1)], [Mark(1, 1.0, 45)], None,
                     id="unplaced-checkpoints"),
        pytest.param([Mark(1, 5.0, 45)], [Mark(1, 1.0, 1), Mark(1, 2.0, 2)], None,
                     id="one-checkpoint-after-everything-cannot-tell"),
    ],
)
def test_step_scale_conflict(checkpoints: list[Mark], validations: list[Mark],
                             words: str | None) -> None:
    found = step_scale_conflict(checkpoints, validations)
    assert (found.describe() if found else None) == words


def _disagree(v: Mark, c: Mark) -> bool:
    assert v.time is not None and c.time is not None
    return v.attempt == c.attempt and (v.step > c.step if v.time <= c.time else v.step < c.step)


@given(st.lists(marks, max_size=8), st.lists(reports, max_size=12))
def test_step_scale_conflict_matches_a_plain_scan(checkpoints: list[Mark],
                                                  validations: list[Mark]) -> None:
    placed = [c for c in checkpoints if c.attempt is not None and c.time is not None]
    any_pair = any(_disagree(v, c) for v in validations for c in placed)
    found = step_scale_conflict(checkpoints, validations)
    assert (found is not None) == any_pair
    if found is not None:
        assert found.checkpoint in placed and found.validation in validations
        assert _disagree(found.validation, found.checkpoint)


# --- a real run -------------------------------------------------------------------------


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_per_epoch_validation_and_per_step_checkpoints_get_the_value_each_was_saved_after(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    config = {"name": "units", "harness": True,
              "entrypoint": [sys.executable, str(FIXTURES / "epoch_validation.py"),
                             "0.5,0.2,0.4,0.3", "--early-save", "5"],
              "failure_policy": {"stop_grace": 1.0},
              "searcher": {"name": "single", "metric": "val_loss"},
              "checkpoint_storage": {"type": "shared_fs", "path": str(tmp_path / "storage"),
                                     "save_trial_best": 1, "save_trial_latest": 1}}
    experiment_id = create_experiment(sqlite_rig.store, sqlite_rig.home, sqlite_rig.admin,
                                      yaml.safe_dump(config), archive=None)
    with sqlite_rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    assert sqlite_rig.run_to_end_of(experiment_id, trial_id).state == "SUCCEEDED"

    shown = {c["step"]: (c["metric"], c["metric_step"])
             for c in trial_checkpoints(sqlite_rig.store, trial_id).rows}
    assert shown == {5: (None, None), 10: (0.5, 1), 20: (0.2, 2), 30: (0.4, 3), 40: (0.3, 4)}

    with sqlite_rig.store.session_scope() as s:
        warnings = s.scalars(select(Event.message).where(
            Event.trial_id == trial_id, Event.reason == "step scales differ")).all()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("validation and checkpoint steps use different scales: in "
                                  "attempt 1 the validation of step "), warnings
    assert "was reported after the checkpoint of step" in warnings[0]

    worker = StorageWorker(sqlite_rig.store, sqlite_rig.home)
    worker.recover()
    _drain(worker)
    after = {c["step"]: c for c in trial_checkpoints(sqlite_rig.store, trial_id).rows}
    assert {step for step, c in after.items() if c["state"] != "deleted"} == {20, 40}
    assert "best 1 (metric 0.2 at step 2)" in after[20]["kept_because"]
    assert "latest 1" in after[40]["kept_because"]
