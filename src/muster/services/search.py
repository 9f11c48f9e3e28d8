"""Search progress services: an experiment's best trial and its trials ranked by a metric.

What the routes call, and what tests call directly. A trial's value of a validation metric
is the best of its rank-0 validation reports (NaN and ±inf are no value); see
`views.best_of_reports`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from muster.config.schema import SearcherConfig
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.services import views
from muster.services.experiments import experiment_or_404
from muster.services.validation import best_validation, validation_reports
from muster.states import TrialState
from muster.store import Store, Trial

__all__ = ["best_trial", "list_trials", "sort_goals"]


def best_trial(store: Store, experiment_id: int) -> dict[str, Any]:
    """The SUCCEEDED trial (stopped early or not) with the best value of the searcher's
    metric, as `trial_detail` plus its `best_validation`; ties go to the lowest number.

    Raises:
        NotFound: no such experiment, or no SUCCEEDED trial has reported the metric yet.
        Conflict: the experiment's searcher names no metric to compare trials by.
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        searcher = views.searcher_settings(exp)
        if searcher.metric is None:
            raise Conflict(f"experiment {experiment_id} has no searcher metric to rank its "
                           "trials by; compare them by a metric they report with `muster "
                           f"trial list {experiment_id} --sort METRIC`, or name one in the "
                           "config's `searcher.metric` next time")
        succeeded = s.scalars(select(Trial).where(
            Trial.experiment_id == experiment_id,
            Trial.state == TrialState.SUCCEEDED.value)).all()
        best = best_validation(s, [t.id for t in succeeded],
                                     views.searcher_goals(searcher))
        winner = views.best_trial_of(succeeded, best, searcher)
        if winner is None:
            raise NotFound(f"experiment {experiment_id} has no SUCCEEDED trial with a finite "
                           f"{searcher.metric!r} yet; `muster trial list {experiment_id}` "
                           "shows how its trials are doing")
        return {**views.trial_detail(winner), "best_validation": best[winner.id]}


def list_trials(store: Store, experiment_id: int, sort: str | None = None) -> list[dict[str, Any]]:
    """The experiment's trials as `trial_summary` rows: by number, or with `sort` by that
    validation metric (the searcher's in its direction, any other smallest first; trials
    without a value last, ties by number). `best_validation` holds the searcher's metric and
    the sort metric.

    Raises:
        NotFound: no such experiment.
        InvalidRequest: `sort` is neither the searcher's metric nor one a trial reported.
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        searcher = views.searcher_settings(exp)
        trials = s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)
                           .options(selectinload(Trial.attempts))
                           .order_by(Trial.number, Trial.id)).all()
        goals = sort_goals(searcher, sort)
        reports = validation_reports(s, [t.id for t in trials]) if goals else []
        best = views.best_of_reports(reports, goals)
        if sort is not None:
            _check_sort_metric(experiment_id, sort, searcher, reports)
            trials = sorted(trials, key=lambda t: (
                views.metric_order(best.get(t.id, {}).get(sort), goals[sort]), t.number, t.id))
        return [views.trial_summary(t, best.get(t.id, {})) for t in trials]


def sort_goals(searcher: SearcherConfig, sort: str | None) -> dict[str, bool]:
    """The metrics a trial list takes the best of: the searcher's in its direction, and a
    sort metric other than it with smaller first."""
    goals = views.searcher_goals(searcher)
    if sort is not None and sort not in goals:
        goals[sort] = True
    return goals


def _check_sort_metric(
    experiment_id: int, sort: str, searcher: SearcherConfig,
    reports: list[tuple[int, dict[str, Any]]],
) -> None:
    known = set(views.searcher_goals(searcher)).union(
        *(values for _, values in reports))
    if sort not in known:
        shown = ", ".join(sorted(known)) or "none reported yet"
        raise InvalidRequest(f"no trial of experiment {experiment_id} reported a validation "
                             f"metric {sort!r}; sort by one of its validation metrics: {shown}")
