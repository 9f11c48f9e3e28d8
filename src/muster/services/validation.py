"""Trials' validation values as the store holds them: what `best_validation` is made of.

A trial's value of a validation metric is the best of its rank-0 validation reports (NaN,
±inf and anything not a number are no value: the lowest where smaller is better, else the
highest), read from its metric series (`muster.store.series`), not from the reports.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy.orm import Session

from muster.metrics_lines import VALIDATION
from muster.services.views import Goals
from muster.store import series

__all__ = ["best_validation"]


def best_validation(
    s: Session, trial_ids: Collection[int], goals: Goals
) -> dict[int, dict[str, float]]:
    """Per trial, the best value of each metric in `goals` (name → smaller is better) over
    its rank-0 validation reports; a trial with no value of any is left out. One query."""
    if not goals:
        return {}
    best: dict[int, dict[str, float]] = {}
    for trial_id, values in series.extremes(s, trial_ids, VALIDATION, list(goals)).items():
        best[trial_id] = {name: low if goals[name] else high
                          for name, (low, high) in values.items()}
    return best
