"""The experiments list, a page at a time: filtered, sorted and counted in the database.

What the web UI's list page and `GET /api/v1/experiments` show; neither ever loads every
experiment or every trial. A page's rows are read in a handful of queries whatever its
size: the experiments (with their owners), their trials' states, their SUCCEEDED trials,
and those trials' rank-0 validation values of the searcher's metric (the best so far).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, String, cast, func, select
from sqlalchemy.orm import Session, joinedload

from muster.errors import InvalidRequest, NotFound
from muster.services import views
from muster.services.validation import best_validation
from muster.states import ExperimentState, TrialState
from muster.store import Experiment, Store, Trial, User

__all__ = ["MAX_PAGE", "SORTS", "ExperimentFilter", "Page", "list_page"]

MAX_PAGE = 500  # rows at most in one page
# What a list may be sorted by: the API's `sort` words.
SORTS = {
    "id": Experiment.id,
    "name": Experiment.name,
    "state": Experiment.state,
    "created": Experiment.created_at,
    "ended": Experiment.ended_at,
    "priority": Experiment.priority,
    "owner": User.name,
}


@dataclass(frozen=True)
class ExperimentFilter:
    """Which experiments a list shows; None: any."""

    state: ExperimentState | None = None
    owner: str | None = None  # a user's name
    label: str | None = None  # one of its labels, exactly
    name: str | None = None  # part of its name, any case
    archived: bool = False  # include archived experiments (hidden by default)

    def where(self, query: Select[Experiment], s: Session) -> Select[Experiment]:
        """`query` narrowed to these experiments.

        Raises:
            NotFound: `owner` names no user.
        """
        if self.state is not None:
            query = query.where(Experiment.state == self.state.value)
        if not self.archived:
            query = query.where(Experiment.archived.is_(False))
        query = query.where(Experiment.delete_requested_at.is_(None))
        if self.owner is not None:
            owner_id = s.scalar(select(User.id).where(User.name == self.owner))
            if owner_id is None:
                raise NotFound(f"user {self.owner!r} does not exist; `muster user list` shows "
                               "the users")
            query = query.where(Experiment.owner_id == owner_id)
        if self.label is not None:
            # Labels are a JSON list: the label as a JSON string is a token of that text.
            token = json.dumps(self.label)
            query = query.where(cast(Experiment.labels, String).contains(token, autoescape=True))
        if self.name is not None:
            query = query.where(func.lower(Experiment.name).contains(self.name.lower(),
                                                                     autoescape=True))
        return query


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    total: int  # how many experiments the filter matches in all
    offset: int
    limit: int | None


def list_page(store: Store, where: ExperimentFilter | None = None, *, sort: str = "id",
              descending: bool = False, offset: int = 0, limit: int | None = None) -> Page:
    """One page of experiment summaries (`views.experiment_summary`, with their progress,
    review and verification badges and best trial), by `sort` (ties: id).

    Raises:
        InvalidRequest: an unknown `sort` or a `limit` over `MAX_PAGE`.
        NotFound: the filter's owner is no user.
    """
    column = SORTS.get(sort)
    if column is None:
        raise InvalidRequest(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be 1 to {MAX_PAGE}, got {limit}")
    where = where or ExperimentFilter()
    with store.session_scope() as s:
        base = where.where(select(Experiment).outerjoin(User, Experiment.owner_id == User.id),
                           s)
        total = s.scalar(select(func.count()).select_from(base.subquery())) or 0
        order = (column.desc(), Experiment.id.desc()) if descending else (column,
                                                                          Experiment.id)
        query = base.options(joinedload(Experiment.owner)).order_by(
            *(o.nulls_last() for o in order)).offset(offset)
        if limit is not None:
            query = query.limit(limit)
        experiments = list(s.scalars(query).unique())
        return Page(summaries(s, experiments), total, offset, limit)


def summaries(s: Session, experiments: Sequence[Experiment]) -> list[dict[str, Any]]:
    """The summaries of `experiments`, their trials read in bulk, not one by one."""
    ids = [e.id for e in experiments]
    if not ids:
        return []
    states: dict[int, list[str]] = defaultdict(list)
    for experiment_id, state in s.execute(select(Trial.experiment_id, Trial.state).where(
            Trial.experiment_id.in_(ids)).order_by(Trial.id)):
        states[experiment_id].append(state)
    succeeded: dict[int, list[Trial]] = defaultdict(list)
    for trial in s.scalars(select(Trial).where(
            Trial.experiment_id.in_(ids), Trial.state == TrialState.SUCCEEDED.value)):
        succeeded[trial.experiment_id].append(trial)
    rows = []
    for exp in experiments:
        mine = succeeded.get(exp.id, [])
        rows.append(views.experiment_summary(
            exp, states=states.get(exp.id, []),
            unverified=sum(views.is_unverified(t) for t in mine), best=_best(s, exp, mine)))
    return rows


def _best(s: Session, exp: Experiment, succeeded: list[Trial]) -> dict[str, Any] | None:
    searcher = views.searcher_settings(exp)
    goals = views.searcher_goals(searcher)
    if not goals or not succeeded:
        return None
    best = best_validation(s, [t.id for t in succeeded], goals)
    return views.best_view(succeeded, best, searcher)
