"""Search progress services: an experiment's best trial and its trials ranked by a metric.

What the routes call, and what tests call directly. A trial's value of a validation metric
is the best of its rank-0 validation reports (NaN and ±inf are no value); see
`validation.best_validation`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from muster import api
from muster.config.schema import MAX_TRIALS, SearcherConfig
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.services import progress, views
from muster.services.experiments import TrialPartOf, experiment_or_404
from muster.services.listing import check_window, window
from muster.services.validation import best_validation
from muster.states import MetricKind, TrialState, values
from muster.store import Attempt, Store, Trial, series
from muster.store.configs import experiment_searcher

__all__ = ["MAX_RANGES", "ORDERS", "TrialPage", "TrialQuery", "ValueRange", "best_trial",
           "list_trials", "pareto_front", "sort_goals", "trial_page"]


def best_trial(store: Store, experiment_id: int, part_of: TrialPartOf | None = None
               ) -> api.TrialDetail:
    """The SUCCEEDED trial (stopped early or not) with the best value of the searcher's
    metric, as `trial_detail` (its `snapshot` from `part_of`) plus its `best_validation`;
    ties go to the lowest number.

    Raises:
        NotFound: no such experiment, or no SUCCEEDED trial has reported the metric yet.
        Conflict: the experiment's searcher names no metric to compare trials by.
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        searcher = experiment_searcher(exp)
        if searcher.metric is None:
            raise Conflict(f"experiment {experiment_id} has no searcher metric to rank its "
                           "trials by; compare them by a metric they report with `muster "
                           f"trial list {experiment_id} --sort METRIC`, or name one in the "
                           "config's `searcher.metric` next time")
        succeeded = s.scalars(select(Trial).where(
            Trial.experiment_id == experiment_id,
            Trial.state == TrialState.SUCCEEDED)).all()
        best = best_validation(s, [t.id for t in succeeded],
                                     views.searcher_goals(searcher))
        winner = views.best_trial_of(succeeded, best, searcher)
        if winner is None:
            raise NotFound(f"experiment {experiment_id} has no SUCCEEDED trial with a finite "
                           f"{searcher.metric!r} yet; `muster trial list {experiment_id}` "
                           "shows how its trials are doing")
        snapshot = None if part_of is None else part_of(winner)
        return views.trial_detail(winner, best[winner.id], snapshot)


def pareto_front(store: Store, experiment_id: int) -> api.ParetoFront:
    """The experiment's SUCCEEDED trials by the searcher's objectives (each one's value in
    the last report that held it, as the search compared them): those on the Pareto front,
    then the rest. A search of one objective has the trials of its best value as its front.

    Raises:
        NotFound: no such experiment.
        Conflict: the experiment's searcher names no metric to compare trials by.
    """
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        searcher = experiment_searcher(exp)
        objectives = searcher.objectives()
        if not objectives:
            raise Conflict(f"experiment {experiment_id} has no searcher metric, so no trial "
                           "beats another; name them in the config's `searcher.metrics` (or "
                           "`searcher.metric`) next time")
        trials = s.execute(select(Trial.id, Trial.number, Trial.hparams).where(
            Trial.experiment_id == experiment_id, Trial.state == TrialState.SUCCEEDED)
            .order_by(Trial.number, Trial.id)).all()
        names = [o.name for o in objectives]
        ended = series.final_values(s, [t.id for t in trials], names)
    points: list[api.FrontPoint] = []
    without = 0
    for trial_id, number, hparams in trials:
        values = ended.get(trial_id, {})
        if not all(math.isfinite(values.get(name, math.nan)) for name in names):
            without += 1
            continue
        points.append({"trial_id": trial_id, "number": number, "hparams": hparams,
                       "values": {name: values[name] for name in names}, "on_front": False})
    signs = [1.0 if o.smaller_is_better else -1.0 for o in objectives]
    front, others = views.pareto_split(points, lambda point: tuple(
        sign * point["values"][name] for sign, name in zip(signs, names, strict=True)))
    for point in front:
        point["on_front"] = True
    return {"experiment_id": experiment_id,
            "objectives": [views.objective_view(o.name, o.smaller_is_better)
                           for o in objectives],
            "points": front + others, "front": len(front), "without_values": without}


def list_trials(store: Store, experiment_id: int, sort: str | None = None
                ) -> list[api.TrialSummary]:
    """The experiment's trials as `trial_summary` rows: by number, or with `sort` by that
    validation metric (the searcher's in its direction, any other smallest first; trials
    without a value last, ties by number). `best_validation` holds the searcher's metric and
    the sort metric.

    Raises:
        NotFound: no such experiment.
        InvalidRequest: `sort` is neither the searcher's metric nor one a trial reported.
    """
    return trial_page(store, experiment_id, TrialQuery(sort=sort)).rows


HPARAM_ORDER = "hparam:"
METRIC_FIELD = "metric:"
MAX_RANGES = 16  # ranges one query filters by


@dataclass(frozen=True)
class ValueRange:
    """Trials whose value of `field` lies in [low, high], an end open when None.

    `field` is `hparam:NAME` (a hyperparameter by dotted name; a trial whose value is no
    number is out) or `metric:NAME` (a validation metric's best value as the table shows it:
    the searcher's in its direction, any other its smallest; a trial without one is out).
    In a query string it is one word, `FIELD:LOW:HIGH` (`metric:val_loss::0.5`)."""

    field: str
    low: float | None = None
    high: float | None = None

    @classmethod
    def parse(cls, word: str) -> ValueRange:
        """The range a `FIELD:LOW:HIGH` word names.

        Raises:
            InvalidRequest: not that shape, an unknown field kind, an end no finite number,
                or the low end above the high.
        """
        field, _, ends = word.rpartition(":")
        field, _, low = field.rpartition(":")
        if not field.startswith((HPARAM_ORDER, METRIC_FIELD)) or field in (
                HPARAM_ORDER, METRIC_FIELD):
            raise InvalidRequest(f"a range must look like hparam:NAME:LOW:HIGH or "
                                 f"metric:NAME:LOW:HIGH (an end may be empty), got {word!r}")
        bound = cls(field, _end(low, word), _end(ends, word))
        if bound.low is not None and bound.high is not None and bound.low > bound.high:
            raise InvalidRequest(f"a range's low end must not be above its high end, got "
                                 f"{word!r}; swap them")
        return bound

    def word(self) -> str:
        return f"{self.field}:{_word(self.low)}:{_word(self.high)}"

    @property
    def metric(self) -> str | None:
        """The validation metric it bounds, if it bounds one."""
        return self.field[len(METRIC_FIELD):] if self.field.startswith(METRIC_FIELD) else None

    def holds(self, value: Any) -> bool:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        return (self.low is None or value >= self.low) and (
            self.high is None or value <= self.high)


def _end(text: str, word: str) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidRequest(f"a range's ends must be finite numbers or empty, got {text!r} "
                             f"in {word!r}")
    return value


def _word(end: float | None) -> str:
    return "" if end is None else repr(end)


@dataclass(frozen=True)
class TrialQuery:
    """Which of an experiment's trials a table shows, in what order, a page at a time.

    `sort` is a validation metric (`list_trials`); `order_by` one of `ORDERS`, or
    `hparam:NAME` for a hyperparameter by its dotted name (numbers before text before none);
    `descending` flips either (default: a metric's best first, else ascending); `ranges`
    keeps the trials inside every one of them."""

    sort: str | None = None
    order_by: str | None = None
    descending: bool = False
    states: frozenset[TrialState] = frozenset()
    offset: int = 0
    limit: int | None = None
    ranges: tuple[ValueRange, ...] = ()


ORDERS = ("number", "state", "restarts", "started", "ended")
MAX_TRIAL_PAGE = MAX_TRIALS  # trials in one page: a search's most, so that one holds all


@dataclass(frozen=True)
class TrialPage:
    rows: list[api.TrialSummary]
    total: int  # how many trials the filter matches in all


def trial_page(store: Store, experiment_id: int, query: TrialQuery) -> TrialPage:
    """A page of the experiment's trials (`trial_summary` rows, with `early_stop`): those in
    `query.states` (any when empty) and inside its `ranges`, in `query`'s order (ties:
    number), `limit` from `offset`, and how many match in all.

    Raises:
        NotFound: no such experiment.
        InvalidRequest: both `sort` and `order_by`; an unknown `order_by`; a `sort` or range
            metric no trial reported; over `MAX_RANGES` ranges; a `limit` over
            `MAX_TRIAL_PAGE`.
    """
    _check_query(query)
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        searcher = experiment_searcher(exp)
        if query.sort is None and not query.ranges and query.order_by in (None, "number"):
            page_ids, total = _numbered_page(s, experiment_id, query)
            best = best_validation(s, page_ids, sort_goals(searcher, None))
        else:
            page_ids, total, best = _computed_page(s, experiment_id, searcher, query)
        whole = {t.id: t for t in s.scalars(select(Trial).where(Trial.id.in_(page_ids))
                                            .options(selectinload(Trial.attempts)))}
        # (A trial deleted between the two reads, with its experiment, is left out.)
        shown = [whole[trial_id] for trial_id in page_ids if trial_id in whole]
        measured = progress.of_running(s, shown)  # the page's RUNNING trials alone
        rows = [views.trial_summary(t, best.get(t.id, {}), measured.get(t.id)) for t in shown]
        return TrialPage(rows, total)


def _numbered_page(s: Session, experiment_id: int, query: TrialQuery) -> tuple[list[int], int]:
    """The ids of the page's trials by number (the default order), paged and counted in the
    database, and how many match in all."""
    order = ((Trial.number.desc(), Trial.id.desc()) if query.descending
             else (Trial.number, Trial.id))
    select_ids = select(Trial.id).where(Trial.experiment_id == experiment_id).order_by(*order)
    if query.states:
        select_ids = select_ids.where(Trial.state.in_(values(query.states)))
    return window(s, select_ids, query.offset, query.limit)


def _computed_page(s: Session, experiment_id: int, searcher: SearcherConfig,
                   query: TrialQuery) -> tuple[list[int], int, dict[int, dict[str, float]]]:
    """The ids of the page's trials in an order or a filter of values the database does not
    hold as columns (a metric's best, a hyperparameter), how many match in all, and the best
    values of every trial that matches."""
    # Every trial as the columns its filters and orders read (a search has thousands;
    # loading each as a row with its attempts cost ~0.2 ms a trial), the page's alone
    # in whole by the caller.
    columns = _ORDER_COLUMNS + ((_ATTEMPTS,) if query.order_by == "restarts" else ())
    select_trials = select(*columns).where(
        Trial.experiment_id == experiment_id).order_by(Trial.number, Trial.id)
    if query.states:
        select_trials = select_trials.where(Trial.state.in_(values(query.states)))
    trials: list[_Ordered] = list(s.execute(select_trials).all())
    goals = sort_goals(searcher, query.sort)
    ranged = [r.metric for r in query.ranges if r.metric is not None]
    goals |= {name: True for name in ranged if name not in goals}
    best = best_validation(s, [t.id for t in trials], goals)
    if query.sort is not None or ranged:
        reported = series.names(s, [t.id for t in trials], MetricKind.VALIDATION)
        for metric, use in [(query.sort, "sort"), *((name, "filter") for name in ranged)]:
            if metric is not None:
                _check_sort_metric(experiment_id, metric, searcher, reported, use)
    trials = [t for t in trials if _in_ranges(t, best.get(t.id, {}), query.ranges)]
    _order(trials, query, best, goals)
    end = None if query.limit is None else query.offset + query.limit
    return [t.id for t in trials[query.offset:end]], len(trials), best


class _Ordered(Protocol):
    """What `_in_ranges` and `_order` read of a trial: `_ORDER_COLUMNS` (and `attempts`
    for the restarts order)."""

    id: int
    number: int
    state: TrialState
    hparams: dict[str, Any]
    started_at: float | None
    ended_at: float | None


# What `_in_ranges` and `_order` read of a trial.
_ORDER_COLUMNS = (Trial.id, Trial.number, Trial.state, Trial.hparams, Trial.started_at,
                  Trial.ended_at)
# A trial's attempts but warm standbys, for the restarts order (`views.restarts`).
_ATTEMPTS = select(func.count()).where(Attempt.trial_id == Trial.id, Attempt.standby.is_(
    False)).correlate(Trial).scalar_subquery().label("attempts")


def _check_query(query: TrialQuery) -> None:
    if query.sort is not None and query.order_by is not None:
        raise InvalidRequest("give sort (a validation metric) or order_by, not both")
    if query.order_by is not None and query.order_by not in ORDERS and not (
            query.order_by.startswith(HPARAM_ORDER) and len(query.order_by) > len(HPARAM_ORDER)):
        raise InvalidRequest(f"order_by must be one of {', '.join(ORDERS)} or hparam:NAME "
                             f"(a hyperparameter's dotted name), got {query.order_by!r}")
    check_window(query.offset, query.limit, MAX_TRIAL_PAGE)
    if len(query.ranges) > MAX_RANGES:
        raise InvalidRequest(f"filter by at most {MAX_RANGES} ranges, got "
                             f"{len(query.ranges)}")


def _in_ranges(trial: _Ordered, best: dict[str, float], ranges: tuple[ValueRange, ...]) -> bool:
    for bound in ranges:
        value = (best.get(bound.metric) if bound.metric is not None
                 else _dig(trial.hparams, bound.field[len(HPARAM_ORDER):].split(".")))
        if not bound.holds(value):
            return False
    return True


def _order(trials: list[_Ordered], query: TrialQuery, best: dict[int, dict[str, float]],
           goals: dict[str, bool]) -> None:
    """Sorts `trials` in place in `query`'s order."""
    if query.sort is not None:
        metric, sign = query.sort, -1 if query.descending else 1

        def by_metric(t: _Ordered) -> tuple[bool, float, int, int]:
            missing, value = views.metric_order(best.get(t.id, {}).get(metric), goals[metric])
            return missing, sign * value, t.number, t.id  # no value: last either way

        trials.sort(key=by_metric)
    elif query.order_by is not None:
        trials.sort(key=_order_key(query.order_by), reverse=query.descending)
    elif query.descending:
        trials.reverse()


def _order_key(order_by: str) -> Callable[[Any], tuple[Any, ...]]:
    if order_by.startswith(HPARAM_ORDER):
        path = order_by[len(HPARAM_ORDER):].split(".")
        return lambda t: (*_value_order(_dig(t.hparams, path)), t.number, t.id)
    if order_by == "state":
        return lambda t: (t.state, t.number, t.id)
    if order_by == "restarts":
        return lambda t: (max(0, t.attempts - 1), t.number, t.id)
    if order_by in ("started", "ended"):
        return lambda t: (*_value_order(getattr(t, f"{order_by}_at")), t.number, t.id)
    return lambda t: (t.number, t.id)


def _dig(tree: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _value_order(value: Any) -> tuple[int, float, str]:
    """Numbers by value, then text, then anything else, then no value."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return 0, float(value), ""
    if isinstance(value, str):
        return 1, 0.0, value
    if value is None:
        return 3, 0.0, ""
    return 2, 0.0, repr(value)


def sort_goals(searcher: SearcherConfig, sort: str | None) -> dict[str, bool]:
    """The metrics a trial list takes the best of: the searcher's in its direction, and a
    sort metric other than it with smaller first."""
    goals = views.searcher_goals(searcher)
    if sort is not None and sort not in goals:
        goals[sort] = True
    return goals


def _check_sort_metric(
    experiment_id: int, sort: str, searcher: SearcherConfig, reported: set[str],
    use: str = "sort",
) -> None:
    known = set(views.searcher_goals(searcher)) | reported
    if sort not in known:
        shown = ", ".join(sorted(known)) or "none reported yet"
        raise InvalidRequest(f"no trial of experiment {experiment_id} reported a validation "
                             f"metric {sort!r}; {use} by one of its validation metrics: "
                             f"{shown}")
