"""Trials' validation values as the store holds them: what `best_validation` is made of.

A trial's value of a validation metric is the best of its rank-0 validation reports (NaN
and ±inf are no value); `views.best_of_reports` picks it, here the reports are read.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.metrics_lines import VALIDATION
from muster.services.views import Goals, best_of_reports
from muster.store import Metric

__all__ = ["best_validation", "validation_reports"]


def validation_reports(
    s: Session, trial_ids: Collection[int]
) -> list[tuple[int, dict[str, Any]]]:
    """(trial id, values) of every rank-0 validation report of these trials, in one query."""
    if not trial_ids:
        return []
    rows = s.execute(select(Metric.trial_id, Metric.values).where(
        Metric.trial_id.in_(trial_ids), Metric.kind == VALIDATION, Metric.rank == 0))
    return [(trial_id, values) for trial_id, values in rows]


def best_validation(
    s: Session, trial_ids: Collection[int], goals: Goals
) -> dict[int, dict[str, float]]:
    """`best_validation` of these trials (see `views.best_of_reports`), in one query."""
    if not goals:
        return {}
    return best_of_reports(validation_reports(s, trial_ids), goals)
