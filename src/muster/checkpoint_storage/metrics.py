"""The searcher's metric of each checkpoint: the validation it was saved after.

A checkpoint carries the latest validation of the searcher's metric that rank 0 reported in
the checkpoint's own attempt before the checkpoint was saved, in the order of the metrics
stream. Its place in that stream is its metadata.json time: the harness writes a rank's
pending metric lines before it stamps and publishes a checkpoint, on the same clock that
stamped each report. Never a value matched by step number: a script may count validation
in epochs and checkpoints in optimizer steps, and then the checkpoint of step 45 is the
model of epoch 1, not of epoch 45.

A checkpoint saved before any validation in its attempt (or whose attempt or time is not
known) has no metric and is never anyone's best; one saved after a NaN validation carries
that NaN, and is never best either. Only reports from a metrics file count
(`MetricSource.HARNESS`): a line read from a log carries no time the process stamped.

`step_scale_conflict` finds the sign that a trial's validation and checkpoint steps count in
different units (`muster.supervise.step_scales` warns once per trial).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.states import MetricKind, MetricSource
from muster.store import Checkpoint, Metric

__all__ = ["Mark", "ScaleConflict", "attribute_metrics", "checkpoint_metrics",
           "step_scale_conflict"]


class Mark(NamedTuple):
    """A validation report or a checkpoint save in a trial's stream: its attempt, its time
    (the report's, or metadata.json's) and its step; attempt and time are None when a
    checkpoint's metadata does not say them."""

    attempt: int | None
    time: float | None
    step: int


class ScaleConflict(NamedTuple):
    """A validation and a checkpoint of one attempt whose order in time and in step differ."""

    validation: Mark
    checkpoint: Mark

    def describe(self) -> str:
        validated_first = (self.validation.time or 0.0) <= (self.checkpoint.time or 0.0)
        return (f"in attempt {self.checkpoint.attempt} the validation of step "
                f"{self.validation.step} was reported "
                f"{'before' if validated_first else 'after'} the checkpoint of step "
                f"{self.checkpoint.step} was saved")


def checkpoint_metrics(s: Session, rows: Sequence[Checkpoint], metric: str | None
                       ) -> dict[int, tuple[float, int]]:
    """Checkpoint id → (value, the step of the validation it was saved after), for those
    that have one (`attribute_metrics`)."""
    if metric is None or not rows:
        return {}
    trial_ids = sorted({row.trial_id for row in rows})
    validations: dict[int, list[tuple[Mark, float]]] = defaultdict(list)
    for trial_id, attempt, time, step, values in s.execute(
            select(Metric.trial_id, Metric.attempt, Metric.time, Metric.step, Metric.values)
            .where(Metric.trial_id.in_(trial_ids), Metric.kind == MetricKind.VALIDATION,
                   Metric.rank == 0, Metric.source == MetricSource.HARNESS)
            .order_by(Metric.id)):
        value = values.get(metric) if isinstance(values, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            validations[trial_id].append((Mark(attempt, time, step), float(value)))
    saves: dict[int, dict[int, Mark]] = defaultdict(dict)
    for row in rows:
        saves[row.trial_id][row.id] = Mark(row.attempt, row.created_at, row.step)
    found: dict[int, tuple[float, int]] = {}
    for trial_id in trial_ids:
        found.update(attribute_metrics(saves[trial_id], validations[trial_id]))
    return found


def attribute_metrics(
    checkpoints: Mapping[int, Mark], validations: Sequence[tuple[Mark, float]]
) -> dict[int, tuple[float, int]]:
    """The metric of each checkpoint of one trial, and the step of the validation it is from.

    A checkpoint gets the last validation, in the order reported, of its own attempt whose
    time is not after its save; with none, or with its attempt or time unknown, it is left
    out. A non-finite value is kept as it is (the planner counts it as no metric).

    Args:
        checkpoints: checkpoint id -> its save.
        validations: (report, value) of the searcher metric, in the order reported.
    """
    streams = _by_attempt(validations)
    attributed: dict[int, tuple[float, int]] = {}
    for checkpoint_id, saved in checkpoints.items():
        if saved.attempt is None or saved.time is None or saved.attempt not in streams:
            continue
        found = streams[saved.attempt].last_at_or_before(saved.time)
        if found is not None:
            report, value = validations[found]
            attributed[checkpoint_id] = (value, report.step)
    return attributed


def step_scale_conflict(checkpoints: Iterable[Mark], validations: Sequence[Mark]
                        ) -> ScaleConflict | None:
    """A validation and a checkpoint of one attempt that only different step units explain:
    one reported before the save at a greater step, or after it at a smaller one (steps
    never go back within an attempt). None when every pair agrees."""
    streams = _by_attempt([(report, 0.0) for report in validations])
    known = [c for c in checkpoints if c.attempt is not None and c.time is not None]
    for saved in sorted(known, key=lambda c: (c.time or 0.0, c.step)):
        stream = streams.get(saved.attempt)
        found = None if stream is None else stream.disagreeing(saved)
        if found is not None:
            return ScaleConflict(validations[found], saved)
    return None


class _Stream:
    """One attempt's validations sorted by time, with what bisecting a save time needs:
    the last-reported one at or before each position, and the greatest step before and
    the smallest step after it."""

    def __init__(self, reports: list[tuple[float, int, int]]) -> None:
        reports.sort()  # (time, index in the stream, step): ties keep the stream's order
        self.times = [time for time, _, _ in reports]
        self.last_reported = list(accumulate((index for _, index, _ in reports), max))
        # (step, index) of the greatest step at or before each position, of the smallest
        # step at or after it
        self.greatest_step = list(accumulate(((s, i) for _, i, s in reports), max))
        self.smallest_step_after = list(accumulate(
            ((s, i) for _, i, s in reversed(reports)), min))[::-1]

    def last_at_or_before(self, time: float) -> int | None:
        at = bisect.bisect_right(self.times, time)
        return self.last_reported[at - 1] if at else None

    def disagreeing(self, saved: Mark) -> int | None:
        """A validation whose step and time put it on the wrong side of `saved`."""
        at = bisect.bisect_right(self.times, saved.time or 0.0)
        if at and self.greatest_step[at - 1][0] > saved.step:
            return self.greatest_step[at - 1][1]
        if at < len(self.times) and self.smallest_step_after[at][0] < saved.step:
            return self.smallest_step_after[at][1]
        return None


def _by_attempt(validations: Sequence[tuple[Mark, float]]) -> dict[int | None, _Stream]:
    """Each attempt's stream; a report whose time is not finite cannot be placed."""
    reports: dict[int | None, list[tuple[float, int, int]]] = defaultdict(list)
    for index, (report, _) in enumerate(validations):
        if report.time is not None and math.isfinite(report.time):
            reports[report.attempt].append((report.time, index, report.step))
    return {attempt: _Stream(rows) for attempt, rows in reports.items()}

