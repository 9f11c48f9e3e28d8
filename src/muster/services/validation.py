"""Trials' validation values as the store holds them: what `best_validation` is made of.

A trial's value of a validation metric is the best of its rank-0 validation reports (NaN
and ±inf are no value): `views.best_of_reports` over the reports, or, as `best_validation`
reads it, the lowest or highest value its metric series keeps (`muster.store.series`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.metrics_lines import VALIDATION
from muster.services.views import Goals
from muster.store import Metric, series

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
    """`best_validation` of these trials (what `views.best_of_reports` makes of their
    reports), read from their metric series: one row per trial and metric."""
    if not goals:
        return {}
    best: dict[int, dict[str, float]] = {}
    for trial_id, values in series.extremes(s, trial_ids, VALIDATION, list(goals)).items():
        best[trial_id] = {name: low if goals[name] else high
                          for name, (low, high) in values.items()}
    return best
