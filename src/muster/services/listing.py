"""The experiments list, a page at a time: filtered, sorted and counted in the database.

What the web UI's list page and `GET /api/v1/experiments` show; neither ever loads every
experiment or every trial. A page's rows are read in a handful of queries whatever its
size: the experiments (with their owners), their trials' states, their SUCCEEDED trials,
and those trials' rank-0 validation values of the searcher's metric (the best so far).

Every other list of the API is paged the same way, with this module's `Page`,
`check_window` and `window` (one COUNT, one LIMIT/OFFSET, an order that ends on a unique
column). A list inside a row (a model's versions, an environment's trials) holds its newest
`MAX_NESTED` beside a count of all: `newest_place` picks them for every row of a page in one
query.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    ColumnElement,
    ColumnExpressionArgument,
    Label,
    Select,
    String,
    cast,
    desc,
    func,
    select,
)
from sqlalchemy.orm import Session, defer, joinedload, selectinload

from muster import api
from muster.config.schema import SearcherConfig
from muster.errors import InvalidRequest, NotFound
from muster.services import progress, views
from muster.services.validation import best_validation_each
from muster.states import ExperimentState, TrialState
from muster.store import Experiment, Store, Trial, User
from muster.store.configs import stored_searcher

__all__ = ["MAX_NESTED", "MAX_PAGE", "SORTS", "ExperimentFilter", "Page", "check_window",
           "list_page", "newest_place", "window"]

Row = TypeVar("Row")

MAX_PAGE = 500  # rows at most in one page
# Rows at most of a list inside a row (`RegisteredModelView.versions`,
# `EnvironmentView.trials`): its newest, beside a count of all (`versions_total`, ...).
MAX_NESTED = 100
# What a summary never shows of a trial: not read (the manifest and the freeze can be large).
_UNLISTED = (defer(Trial.manifest), defer(Trial.search_state), defer(Trial.environment_freeze))
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

    def conditions(self, s: Session) -> list[ColumnElement[bool]]:
        """What these experiments are, in SQL (the first two served by
        `ix_experiments_listed`, with the id).

        Raises:
            NotFound: `owner` names no user.
        """
        found: list[ColumnElement[bool]] = (
            [Experiment.archived.is_(False)] if not self.archived else [])
        found.append(Experiment.delete_requested_at.is_(None))
        if self.state is not None:
            found.append(Experiment.state == self.state)
        if self.owner is not None:
            owner_id = s.scalar(select(User.id).where(User.name == self.owner))
            if owner_id is None:
                raise NotFound(f"user {self.owner!r} does not exist; `muster user list` shows "
                               "the users")
            found.append(Experiment.owner_id == owner_id)
        if self.label is not None:
            # Labels are a JSON list: the label as a JSON string is a token of that text.
            token = json.dumps(self.label)
            found.append(cast(Experiment.labels, String).contains(token, autoescape=True))
        if self.name is not None:
            found.append(func.lower(Experiment.name).contains(self.name.lower(),
                                                              autoescape=True))
        return found


@dataclass(frozen=True)
class Page(Generic[Row]):
    """One page of a list: `limit` rows at most from `offset`, of `total`."""

    rows: list[Row]
    total: int  # how many rows the filter matches in all
    offset: int
    limit: int | None


def check_window(offset: int, limit: int | None, most: int) -> None:
    """Raises InvalidRequest, naming the parameter, unless `offset` and `limit` (1 to
    `most`; None: the list's default) make a page."""
    if offset < 0:
        raise InvalidRequest(f"offset must be 0 or more, got {offset}")
    if limit is not None and not 1 <= limit <= most:
        raise InvalidRequest(f"limit must be 1 to {most}, got {limit}; read the rest a page "
                             "at a time with offset")


def window(s: Session, query: Select[Row], offset: int, limit: int | None
           ) -> tuple[list[Row], int]:
    """The rows of `query` (ordered to a unique column, so that pages neither overlap nor
    skip) `limit` from `offset`, read in the database, and a count of all that it matches."""
    total = s.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    return list(s.scalars(query.offset(offset).limit(limit))), total


def newest_place(key: ColumnExpressionArgument[Any], order: ColumnExpressionArgument[Any]
                 ) -> Label[int]:
    """Each row's place among the rows of its `key`, highest `order` first (1, 2, ...): a
    nested list keeps the rows placed up to `MAX_NESTED`. A window function, alike on SQLite
    and PostgreSQL, so that a page's nested lists are one query however long they are."""
    return func.row_number().over(partition_by=key, order_by=desc(order)).label("place")


def list_page(store: Store, where: ExperimentFilter | None = None, *, sort: str = "id",
              descending: bool = False, offset: int = 0, limit: int | None = None
              ) -> Page[api.ExperimentSummary]:
    """One page of experiment summaries (`views.experiment_summary`, with their progress,
    their trials' verdict counts and best trial), by `sort` (ties: id).

    Raises:
        InvalidRequest: an unknown `sort` or a `limit` over `MAX_PAGE`.
        NotFound: the filter's owner is no user.
    """
    column = SORTS.get(sort)
    if column is None:
        raise InvalidRequest(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    check_window(offset, limit, MAX_PAGE)
    where = where or ExperimentFilter()
    with store.session_scope() as s:
        conditions = where.conditions(s)
        total = s.scalar(select(func.count(Experiment.id)).where(*conditions)) or 0
        order = [o.nulls_last() for o in ((column.desc(), Experiment.id.desc()) if descending
                                          else (column, Experiment.id))]
        # The page's ids first: a database skips `offset` rows it need not read whole.
        page = (select(Experiment.id).outerjoin(User, Experiment.owner_id == User.id)
                .where(*conditions).order_by(*order).offset(offset).limit(limit))
        # Of its config a summary shows the searcher's block alone: the database reads it.
        query = (select(Experiment, Experiment.config["searcher"])
                 .outerjoin(User, Experiment.owner_id == User.id)
                 .where(Experiment.id.in_(page.scalar_subquery()))
                 .options(joinedload(Experiment.owner), defer(Experiment.config),
                          defer(Experiment.config_yaml))
                 .order_by(*order))
        found = s.execute(query).all()  # (the owner is one row: no duplicates to drop)
        searchers = {exp.id: stored_searcher(exp.uuid, block) for exp, block in found}
        return Page(summaries(s, [exp for exp, _ in found], searchers), total, offset, limit)


def summaries(s: Session, experiments: Sequence[Experiment],
              searchers: Mapping[int, SearcherConfig]) -> list[api.ExperimentSummary]:
    """The summaries of `experiments` (with their searchers, by id), their trials read in
    bulk, not one by one."""
    ids = [e.id for e in experiments]
    if not ids:
        return []
    states: dict[int, list[TrialState]] = defaultdict(list)
    for experiment_id, state in s.execute(select(Trial.experiment_id, Trial.state).where(
            Trial.experiment_id.in_(ids)).order_by(Trial.id)):
        states[experiment_id].append(state)
    succeeded: dict[int, list[Trial]] = defaultdict(list)
    for trial in s.scalars(select(Trial).options(*_UNLISTED).where(
            Trial.experiment_id.in_(ids), Trial.state == TrialState.SUCCEEDED)):
        succeeded[trial.experiment_id].append(trial)
    best = best_validation_each(s, {
        trial.id: goals for exp in experiments
        if (goals := views.searcher_goals(searchers[exp.id]))
        for trial in succeeded.get(exp.id, [])})
    running = _running_progress(s, ids)
    rows = []
    for exp in experiments:
        mine = succeeded.get(exp.id, [])
        rows.append(views.experiment_summary(
            exp, states=states.get(exp.id, []), succeeded=mine,
            best=views.best_view(mine, best, searchers[exp.id]) if mine else None,
            running=running.get(exp.id, [])))
    return rows


def _running_progress(s: Session, ids: Sequence[int]
                      ) -> dict[int, list[api.RunningTrialProgress]]:
    """The progress of the RUNNING trials of the page's experiments, by experiment id:
    `views.running_progress` rows."""
    trials = list(s.scalars(select(Trial).options(selectinload(Trial.attempts)).where(
        Trial.experiment_id.in_(ids), Trial.state == TrialState.RUNNING)))
    measured = progress.of_running(s, trials)
    by_experiment: dict[int, list[Trial]] = defaultdict(list)
    for trial in trials:
        by_experiment[trial.experiment_id].append(trial)
    return {exp_id: views.running_progress(mine, measured)
            for exp_id, mine in by_experiment.items()}
