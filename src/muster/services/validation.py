"""Trials' validation values as the store holds them: what `best_validation` is made of.

A trial's value of a validation metric is the best of its rank-0 validation reports (NaN,
±inf and anything not a number are no value: the lowest where smaller is better, else the
highest), read from its metric series (`muster.store.series`), not from the reports.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy.orm import Session

from muster.services.views import Goals
from muster.states import MetricKind
from muster.store import series

__all__ = ["best_validation", "best_validation_each"]


def best_validation(
    s: Session, trial_ids: Collection[int], goals: Goals
) -> dict[int, dict[str, float]]:
    """Per trial, the best value of each metric in `goals` (name → smaller is better) over
    its rank-0 validation reports; a trial with no value of any is left out. One query."""
    return best_validation_each(s, dict.fromkeys(trial_ids, goals))


def best_validation_each(
    s: Session, goals_of: Mapping[int, Goals]
) -> dict[int, dict[str, float]]:
    """`best_validation` of trials with goals of their own (by trial id: those of its
    experiment's searcher), e.g. a page of experiments' trials. One query."""
    names = {name for goals in goals_of.values() for name in goals}
    best: dict[int, dict[str, float]] = {}
    extremes = series.extremes(s, list(goals_of), MetricKind.VALIDATION, names)
    for trial_id, values in extremes.items():
        goals = goals_of[trial_id]
        mine = {name: low if goals[name] else high
                for name, (low, high) in values.items() if name in goals}
        if mine:
            best[trial_id] = mine
    return best
