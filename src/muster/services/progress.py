"""How far each RUNNING trial has come, and when it will end (issue 31, item 7).

Plan, then act: `measure_*` read what a trial reported, in the unit of its planned length
(`verification.planned_length`, the one the `completed` check judges its end by), into a
`Measured`; `estimate`, a pure function, turns it into the `progress` view the trial JSON,
`muster job list`, `muster experiment watch` and the pages show:
`{done, planned, unit, fraction, rate_per_s, eta_seconds, planned_by, measured_by, as_of}`.

Steps come from the metrics table (the harness's reports and those read from the logs),
the latest `WINDOW` reports by step, and rank 0's heartbeat; epochs and records from the
harness's sample counts. The rate is measured within one attempt: over the window, or for
samples from the attempt's start to the latest count. Fewer than two points, or no plan,
give no ETA (`null`, shown as "unknown"): it is never made up.

Cheap by construction: only RUNNING trials are measured, each with two indexed queries on
`metrics` (`trial_id, kind, step`) and a few small files, never a log or a whole history.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from muster import api
from muster.atomic import read_json
from muster.rundir import AttemptDir, RankFile, RankFiles, RunDir
from muster.search.history import generation_of
from muster.states import MetricKind, TrialState
from muster.store import Attempt, Metric, Trial
from muster.store.configs import experiment_config
from muster.supervise import verification
from muster.supervise.verification import Planned

__all__ = ["WINDOW", "Measured", "Point", "estimate", "measure", "of_running"]

WINDOW = 20  # the latest reports by step a rate is measured over
HEARTBEAT = "heartbeat"  # `measured_by` of progress read from rank 0's heartbeat alone
SAMPLES = "samples"  # `measured_by` of epochs and records: the harness's sample counts
STEP_UNITS = ("steps", "batches")  # counted by report steps (`verification.steps_done`)


@dataclass(frozen=True)
class Point:
    """How much was done at a time (unix seconds), in the plan's unit."""

    time: float
    done: float


@dataclass(frozen=True)
class Measured:
    """What a running trial reported of its progress: how much it has done in all, and the
    recent points of one attempt (oldest first) a rate is measured over."""

    done: float
    points: tuple[Point, ...]
    measured_by: str  # "harness" or "log" (metrics), "heartbeat", "samples"
    unit: str = "steps"


def estimate(planned: Planned | None, measured: Measured | None) -> api.TrialProgress | None:
    """The `progress` view: how much is done of how much is planned, the rate over the
    points, and the seconds left at that rate after the latest point (`as_of`). No plan:
    `planned`, `fraction` and `eta_seconds` are null; fewer than two points that moved:
    `rate_per_s` and `eta_seconds` are."""
    if measured is None:
        return None
    rate = rate_of(measured.points)
    view = api.TrialProgress(
        done=_shown(measured.done), planned=None, unit=measured.unit, fraction=None,
        rate_per_s=rate, eta_seconds=None, planned_by=None, measured_by=measured.measured_by,
        as_of=measured.points[-1].time if measured.points else None)
    if planned is None or not _same_unit(planned, measured):
        return view
    left = max(0.0, planned.length - measured.done)
    return {**view, "planned": planned.length, "unit": planned.unit,
            "planned_by": planned.source,
            "fraction": round(min(1.0, measured.done / planned.length), 4),
            "eta_seconds": None if rate is None else round(left / rate, 1)}


def rate_of(points: Sequence[Point]) -> float | None:
    """Progress per second from the first point to the last; None with fewer than two
    points, or none that moved forward in time and in progress."""
    if len(points) < 2:
        return None
    first, last = points[0], points[-1]
    if last.time <= first.time or last.done <= first.done:
        return None
    return (last.done - first.done) / (last.time - first.time)


def of_running(s: Session, trials: Iterable[Trial]) -> dict[int, api.TrialProgress]:
    """The `progress` view of each RUNNING trial among `trials`, by id (only those that
    reported some progress); the other trials are not measured."""
    found = {}
    for trial in trials:
        if trial.state is not TrialState.RUNNING:
            continue
        view = progress_of(s, trial)
        if view is not None:
            found[trial.id] = view
    return found


def progress_of(s: Session, trial: Trial) -> api.TrialProgress | None:
    """One RUNNING trial's `progress` view (`estimate`), or None before it reported any."""
    attempts = [a for a in trial.attempts if not a.standby]
    if not attempts:
        return None
    config = experiment_config(trial.experiment)
    run_dir = AttemptDir(Path(attempts[-1].run_dir)).run.path
    numbers = [a.number for a in attempts]
    plan = (None if config.verify.expected_length is not None
            else verification.read_plan(run_dir, numbers))
    planned = verification.planned_length(
        config.verify, plan, verification.searcher_length(
            config.searcher, config.searcher.length_of(generation_of(trial.search_state))))
    manifest = (trial.manifest or {}).get("file_count")
    return estimate(planned, measure(s, trial.id, planned, attempts[-1], run_dir, numbers,
                                     epoch_size=manifest if isinstance(manifest, int) else None,
                                     tolerance=config.verify.samples_tolerance))


def measure(s: Session, trial_id: int, planned: Planned | None, attempt: Attempt,
            run_dir: Path, attempts: Sequence[int], *, epoch_size: int | None = None,
            tolerance: float = 0.01) -> Measured | None:
    """What the trial reported, in the unit of `planned` (steps without a plan)."""
    if planned is not None and planned.metric is not None:
        return measure_metric(s, trial_id, planned.metric)
    if planned is not None and planned.unit not in STEP_UNITS:
        return measure_samples(run_dir, attempts, attempt.started_at, planned.unit,
                               epoch_size, tolerance)
    validation = planned is not None and planned.validation_steps
    beat = None if validation else read_heartbeat(Path(attempt.run_dir))
    return measure_steps(s, trial_id, verification.step_kinds(validation), beat)


def measure_steps(s: Session, trial_id: int, kinds: Sequence[str],
                  heartbeat: Point | None = None) -> Measured | None:
    """Steps from the metrics table: the first of `kinds` the trial reported, its latest
    `WINDOW` reports by step (those of the newest attempt among them), and `heartbeat`
    (rank 0's latest progress, in steps as reported) when it is newer and further."""
    for kind in kinds:
        where = (Metric.trial_id == trial_id, Metric.kind == kind)
        lowest, highest = s.execute(select(func.min(Metric.step), func.max(Metric.step))
                                    .where(*where)).one()
        if highest is None:
            continue
        rows = s.execute(select(Metric.step, Metric.time, Metric.attempt, Metric.source)
                         .where(*where).order_by(Metric.step.desc()).limit(WINDOW)).all()
        newest = max(row.attempt for row in rows)
        offset = verification.steps_done(0, lowest)
        points = sorted((Point(row.time, row.step + offset) for row in rows
                         if row.attempt == newest), key=lambda p: (p.time, p.done))
        measured = Measured(verification.steps_done(highest, lowest), tuple(points),
                            rows[0].source)
        return _with_heartbeat(measured, heartbeat, offset)
    if heartbeat is None:
        return None
    return Measured(heartbeat.done, (heartbeat,), HEARTBEAT)


def measure_metric(s: Session, trial_id: int, metric: str) -> Measured | None:
    """Progress counted by a time metric (`searcher.time_metric`): the highest value of it
    among rank 0's latest `WINDOW` validation reports, and those of the newest attempt as
    the points."""
    rows = s.execute(select(Metric.time, Metric.attempt, Metric.values, Metric.source)
                     .where(Metric.trial_id == trial_id, Metric.kind == MetricKind.VALIDATION,
                            Metric.rank == 0)
                     .order_by(Metric.attempt.desc(), Metric.step.desc()).limit(WINDOW)).all()
    counted = [(row, float(value)) for row in rows
               if isinstance(value := (row.values or {}).get(metric), int | float)
               and not isinstance(value, bool) and math.isfinite(value)]
    if not counted:
        return None
    newest = counted[0][0].attempt
    points = sorted((Point(row.time, value) for row, value in counted if row.attempt == newest),
                    key=lambda p: (p.time, p.done))
    return Measured(max(value for _, value in counted), tuple(points), counted[0][0].source,
                    unit=metric)


def _with_heartbeat(measured: Measured, heartbeat: Point | None, offset: int) -> Measured:
    """`measured` with the heartbeat's point after its last one, if it is further on."""
    if heartbeat is None or not measured.points:
        return measured
    beat = Point(heartbeat.time, heartbeat.done + offset)
    last = measured.points[-1]
    if beat.time <= last.time or beat.done <= last.done:
        return measured
    return Measured(max(measured.done, beat.done), (*measured.points, beat),
                    measured.measured_by)


def read_heartbeat(attempt_dir: Path) -> Point | None:
    """Rank 0's latest progress (time and step) from its heartbeat; None without a step."""
    try:
        beat = read_json(RankFiles(attempt_dir, 0).heartbeat)
    except ValueError:
        return None  # damaged: written atomically, so it is rewritten whole soon
    if not isinstance(beat, dict):
        return None
    when, step = beat.get("progress_time"), beat.get("step")
    if not isinstance(when, int | float) or not math.isfinite(when):
        return None
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    return Point(float(when), float(step))


def measure_samples(run_dir: Path, attempts: Sequence[int], started_at: float | None,
                    unit: str, epoch_size: int | None, tolerance: float) -> Measured | None:
    """Epochs or records from the harness's sample counts: done in all, and two points,
    the attempt's start (what earlier attempts had done) and its latest count (the time
    its newest samples file was written)."""
    by_epoch = verification.read_samples(run_dir, attempts)[0]
    if not by_epoch:
        return None
    before = verification.read_samples(run_dir, attempts[:-1])[0]
    size = epoch_size or (max(by_epoch.values()) if len(by_epoch) > 1 else None)
    done = samples_done(unit, by_epoch, size, tolerance)
    latest = _newest_write(RunDir(run_dir).attempt(attempts[-1]))
    points: tuple[Point, ...] = ()
    if started_at is not None and latest is not None:
        points = (Point(started_at, samples_done(unit, before, size, tolerance)),
                  Point(latest, done))
    return Measured(done, points, SAMPLES, unit)


def samples_done(unit: str, by_epoch: Mapping[int, int], epoch_size: int | None,
                 tolerance: float) -> float:
    """Records seen, or epochs: each a fraction of `epoch_size` (the data manifest's count,
    else the fullest epoch) where that is known, else the whole ones (`whole_epochs`)."""
    if unit == "records":
        return float(sum(by_epoch.values()))
    if not by_epoch:
        return 0.0
    if not epoch_size:
        return float(verification.whole_epochs(by_epoch, tolerance))
    return sum(min(1.0, seen / epoch_size) for seen in by_epoch.values())


def _newest_write(attempt: AttemptDir) -> float | None:
    """When the attempt's newest samples file was written (its mtime)."""
    times = []
    for _, path in attempt.ranks_with(RankFile.SAMPLES):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue  # gone between the listing and the look: it counts for nothing
    return max(times, default=None)


def _same_unit(planned: Planned, measured: Measured) -> bool:
    """Batches are counted by report steps, as steps are."""
    return planned.unit == measured.unit or {planned.unit, measured.unit} <= set(STEP_UNITS)


def _shown(done: float) -> float | int:
    """Whole numbers as ints (steps, records), fractions of an epoch to two places."""
    return int(done) if float(done).is_integer() else round(done, 2)
