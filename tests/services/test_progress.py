"""Progress and ETA of RUNNING trials: the pure estimate (a table), then real trials that
report against a plan (the harness's steps and epochs, a plain script's log read by muster)
seen through the services the API, `job list`, `experiment watch` and the pages use."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import insert, select

from muster.services import jobs
from muster.services.experiments import create_experiment, describe_experiment, describe_trial
from muster.services.listing import list_page
from muster.services.progress import (
    WINDOW,
    Measured,
    Point,
    estimate,
    measure_metric,
    measure_steps,
    rate_of,
    samples_done,
)
from muster.services.search import TrialQuery, trial_page
from muster.states import TrialState
from muster.store import Metric, Store, Trial
from muster.supervise.verification import Planned
from tests.server.test_search_views import queries
from tests.store.rows import add_experiment, add_trial
from tests.supervise.conftest import FIXTURES, Rig, Submitted

STEPS = Planned("steps", 10, "ctx.plan()")


def points(*pairs: tuple[float, float]) -> tuple[Point, ...]:
    return tuple(Point(time, done) for time, done in pairs)


@pytest.mark.parametrize(("planned", "measured", "expected"), [
    # 5 of 10 steps at 2 steps/s: 2.5 s to go after the last report
    (STEPS, Measured(5, points((100, 1), (102, 5)), "harness"),
     {"done": 5, "planned": 10, "unit": "steps", "fraction": 0.5, "rate_per_s": 2.0,
      "eta_seconds": 2.5, "planned_by": "ctx.plan()", "measured_by": "harness", "as_of": 102}),
    # one point: no rate, so no ETA (unknown, never guessed)
    (STEPS, Measured(3, points((100, 3)), "log"),
     {"done": 3, "planned": 10, "unit": "steps", "fraction": 0.3, "rate_per_s": None,
      "eta_seconds": None, "planned_by": "ctx.plan()", "measured_by": "log", "as_of": 100}),
    # no plan: how far it got, no fraction, no ETA
    (None, Measured(7, points((100, 1), (106, 7)), "harness"),
     {"done": 7, "planned": None, "unit": "steps", "fraction": None, "rate_per_s": 1.0,
      "eta_seconds": None, "planned_by": None, "measured_by": "harness", "as_of": 106}),
    # past the plan: whole, nothing left
    (STEPS, Measured(12, points((100, 11), (101, 12)), "harness"),
     {"done": 12, "planned": 10, "unit": "steps", "fraction": 1.0, "rate_per_s": 1.0,
      "eta_seconds": 0.0, "planned_by": "ctx.plan()", "measured_by": "harness", "as_of": 101}),
    # the searcher's batches are counted by report steps
    (Planned("batches", 40, "searcher.max_length", validation_steps=True),
     Measured(10, points((0, 5), (10, 10)), "harness"),
     {"done": 10, "planned": 40, "unit": "batches", "fraction": 0.25, "rate_per_s": 0.5,
      "eta_seconds": 60.0, "planned_by": "searcher.max_length", "measured_by": "harness",
      "as_of": 10}),
    # epochs from sample counts, a fraction of an epoch done
    (Planned("epochs", 4, "verify.expected_length"),
     Measured(1.5, points((0, 0), (30, 1.5)), "samples", "epochs"),
     {"done": 1.5, "planned": 4, "unit": "epochs", "fraction": 0.375, "rate_per_s": 0.05,
      "eta_seconds": 50.0, "planned_by": "verify.expected_length", "measured_by": "samples",
      "as_of": 30}),
    (STEPS, None, None),
])
def test_estimate(planned: Planned | None, measured: Measured | None,
                  expected: dict[str, Any] | None) -> None:
    assert estimate(planned, measured) == expected


@pytest.mark.parametrize(("pairs", "rate"), [
    (((100, 1), (104, 9)), 2.0),
    (((100, 1), (101, 2), (104, 9)), 2.0),  # first to last
    (((100, 4), (100, 9)), None),  # no time passed
    (((100, 4), (110, 4)), None),  # no progress
    (((100, 4),), None),
    ((), None),
])
def test_rate_needs_two_points_that_moved(pairs: tuple[tuple[float, float], ...],
                                          rate: float | None) -> None:
    assert rate_of(points(*pairs)) == rate


@pytest.mark.parametrize(("unit", "by_epoch", "size", "done"), [
    ("records", {0: 100, 1: 40}, None, 140.0),
    ("epochs", {0: 100, 1: 40}, 100, 1.4),  # a fraction of the epoch under way
    ("epochs", {0: 100, 1: 100, 2: 50}, None, 2.0),  # no size known: whole epochs only
    ("epochs", {0: 120}, 100, 1.0),
    ("epochs", {}, 100, 0.0),
])
def test_samples_count_records_or_epochs(unit: str, by_epoch: dict[int, int],
                                         size: int | None, done: float) -> None:
    assert samples_done(unit, by_epoch, size, 0.01) == pytest.approx(done)


def add_steps(store: Store, steps: list[tuple[int, int, float]]) -> int:
    """A trial with a training report of each (attempt, step, time); its id."""
    with store.session_scope() as s:
        trial = add_trial(s, add_experiment(s), "RUNNING")
        s.execute(insert(Metric), [{"trial_id": trial.id, "attempt": attempt, "rank": 0,
                                    "kind": "training", "step": step, "time": at,
                                    "values": {"loss": 1.0}}
                                   for attempt, step, at in steps])
        return trial.id


def test_steps_are_measured_in_the_newest_attempt_with_two_queries(store: Store) -> None:
    """Attempt 1 reached step 4 (numbered from 0); attempt 2 resumed at 3 and is at 6. The
    done count is the highest step + 1; the rate is attempt 2's alone (1 step/s), not the
    jump between the attempts; rank 0's heartbeat, further on, is the latest point."""
    trial_id = add_steps(store, [(1, step, 100.0 + step) for step in range(5)]
                         + [(2, step, 197.0 + step) for step in range(3, 7)])
    with store.session_scope() as s, queries(store) as seen:
        measured = measure_steps(s, trial_id, ("training", "validation"))
    assert len(seen) == 2, seen  # min/max, then the window: both on the index
    assert measured == Measured(7, (Point(200, 4), Point(201, 5), Point(202, 6),
                                    Point(203, 7)), "harness")
    with store.session_scope() as s:
        beat = measure_steps(s, trial_id, ("training",), heartbeat=Point(205, 8))
        stale = measure_steps(s, trial_id, ("training",), heartbeat=Point(150, 9))
        alone = measure_steps(s, trial_id, ("validation",), heartbeat=Point(205, 8))
        nothing = measure_steps(s, trial_id, ("validation",))
    assert beat is not None and (beat.done, beat.points[-1]) == (9, Point(205, 9))
    assert rate_of(beat.points) == 1.0
    assert stale is not None and stale.points[-1] == Point(203, 7)  # an older heartbeat
    assert alone == Measured(8, (Point(205, 8),), "heartbeat")
    assert nothing is None


def test_the_rate_is_over_the_latest_window_of_reports(store: Store) -> None:
    """A run that sped up: 1 step/s for 100 steps, then 10 steps/s; the window sees the
    latest speed."""
    slow = [(1, step, float(step)) for step in range(1, 101)]
    fast = [(1, 100 + n, 100 + n / 10) for n in range(1, 51)]
    trial_id = add_steps(store, slow + fast)
    with store.session_scope() as s:
        measured = measure_steps(s, trial_id, ("training",))
    assert measured is not None and len(measured.points) == WINDOW
    assert measured.done == 150 and rate_of(measured.points) == pytest.approx(10.0)


def test_a_time_metric_is_measured_by_its_value_in_rank_0s_validation(store: Store) -> None:
    """`searcher.time_metric: epochs`: attempt 1 validated epochs 1-3 (steps 10-30), attempt 2
    resumed and is at epoch 5; the done count is the metric's value, the points attempt 2's;
    a report without the metric, or another rank's, does not count."""
    with store.session_scope() as s:
        trial = add_trial(s, add_experiment(s), "RUNNING")
        rows = [(1, 0, 10 * e, 100.0 + e, {"loss": 1.0, "epochs": e}) for e in (1, 2, 3)]
        rows += [(2, 0, 10 * e, 200.0 + e, {"loss": 1.0, "epochs": e}) for e in (4, 5)]
        rows += [(2, 1, 60, 210.0, {"loss": 1.0, "epochs": 6}),  # rank 1's
                 (2, 0, 55, 209.0, {"loss": 1.0})]  # no epochs
        s.execute(insert(Metric), [{"trial_id": trial.id, "attempt": attempt, "rank": rank,
                                    "kind": "validation", "step": step, "time": at,
                                    "values": values}
                                   for attempt, rank, step, at, values in rows])
        measured = measure_metric(s, trial.id, "epochs")
        nothing = measure_metric(s, trial.id, "tokens")
    assert measured == Measured(5, (Point(204, 4), Point(205, 5)), "harness", "epochs")
    assert nothing is None
    assert estimate(Planned("epochs", 20, "searcher.max_length", True, "epochs"), measured) == {
        "done": 5, "planned": 20, "unit": "epochs", "fraction": 0.25, "rate_per_s": 1.0,
        "eta_seconds": 15.0, "planned_by": "searcher.max_length", "measured_by": "harness",
        "as_of": 205}


# --- real trials -----------------------------------------------------------------------------


def submit(rig: Rig, args: list[str], **config: Any) -> Submitted:
    body = {"name": "progress", "entrypoint": [sys.executable,
                                               str(FIXTURES / "planned_progress.py"), *args],
            "failure_policy": {"stop_grace": 1.0, "heartbeat_timeout": "3s"}, **config}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(body),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def progress_when(rig: Rig, job: Submitted, done: float) -> dict[str, Any]:
    """The trial's progress once it shows `done` and a rate (two points)."""
    def shown() -> dict[str, Any] | None:
        found = describe_trial(rig.store, job.trial_id)["progress"]
        return found if found and found["done"] == done and found["rate_per_s"] else None
    view = rig.tick_until(shown, what=f"trial {job.trial_id} to show {done} done")
    assert isinstance(view, dict)
    return view


def release_and_end(rig: Rig, job: Submitted, gate: Path) -> None:
    """Let the script exit 0 short of its plan: SUSPECT (`completed` failed), no progress."""
    gate.touch()
    rig.until_trial(job, TrialState.SUSPECT)
    assert describe_trial(rig.store, job.trial_id)["progress"] is None  # no longer RUNNING


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_harness_steps_against_ctx_plan(rig: Rig, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = submit(rig, ["steps", "10", "5", str(gate)])
    progress = progress_when(rig, job, 5)
    assert progress["planned"] == 10 and progress["fraction"] == 0.5
    assert (progress["unit"], progress["planned_by"], progress["measured_by"]) == (
        "steps", "ctx.plan()", "harness")
    rate = progress["rate_per_s"]
    assert progress["eta_seconds"] == pytest.approx(5 / rate, abs=0.05)
    # The same view wherever a running trial is shown.
    [row] = trial_page(rig.store, job.experiment_id, TrialQuery()).rows
    [listed] = [e for e in list_page(rig.store).rows if e["id"] == job.experiment_id]
    [job_row] = [j for j in jobs.list_jobs(rig.store).rows if j["trial_id"] == job.trial_id]
    detail = describe_experiment(rig.store, job.experiment_id)
    for seen in (row["progress"], listed["trial_progress"][0]["progress"],
                 job_row["progress"], detail["trials"][0]["progress"],
                 detail["trial_progress"][0]["progress"]):
        assert (seen["done"], seen["planned"], seen["planned_by"]) == (5, 10, "ctx.plan()")
    assert listed["trial_progress"][0]["trial_id"] == job.trial_id
    release_and_end(rig, job, gate)


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_a_plain_script_s_log_against_expected_length(rig: Rig, tmp_path: Path) -> None:
    """nanoGPT's `iter N: loss X` lines, read from the log: steps from 0, so 5 lines are 5
    steps done, against verify.expected_length."""
    gate = tmp_path / "gate"
    job = submit(rig, ["steps", "0", "5", str(gate), "--log"],
                 verify={"expected_length": {"steps": 20}})
    progress = progress_when(rig, job, 5)
    assert (progress["planned"], progress["fraction"], progress["planned_by"],
            progress["measured_by"]) == (20, 0.25, "verify.expected_length", "log")
    assert progress["eta_seconds"] == pytest.approx(15 / progress["rate_per_s"], abs=0.05)
    release_and_end(rig, job, gate)


@pytest.mark.lifecycle
@pytest.mark.timeout(120)
def test_harness_epochs_from_sample_counts(rig: Rig, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = submit(rig, ["epochs", "4", "2", str(gate)])
    progress = progress_when(rig, job, 2)
    assert (progress["planned"], progress["unit"], progress["fraction"],
            progress["measured_by"]) == (4, "epochs", 0.5, "samples")
    assert progress["eta_seconds"] == pytest.approx(2 / progress["rate_per_s"], abs=0.05)
    release_and_end(rig, job, gate)
