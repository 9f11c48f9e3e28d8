"""Usage and goodput: what the slots and GPUs of a window of time were spent on, computed
from the records alone (`muster usage`, `GET /api/v1/usage`, the Usage page).

Exact for the past: every number is a sum of intervals between recorded times (attempts'
`started_at`/`ended_at`, trials' state changes, checkpoints' `created_at`, replicas'
`stalled_since`), clipped to the window `[until - since, until]` (`until` is now). The
definitions (docs/how-to/team.md, "Usage and goodput"):

- A *slot* is one replica's place, whether the scheduler gave it a CPU slot or GPUs
  (`resources.replicas`); GPU time is the same time times the GPUs its replicas held
  (`replicas * gpus_per_replica`).
- An attempt holds its slots from `started_at` (every replica running) to `ended_at` (now,
  while it runs). All of it is *productive* when it ended SUCCEEDED (or was its trial's last,
  stopped early by the searcher: the trial SUCCEEDED, `early_stopped`). Of an attempt that
  ended otherwise (a failure, a restart, a pause, a kill), the part up to the checkpoint a
  later attempt of its trial resumed from (`attempts.resumed_from`) is productive when that
  checkpoint was this attempt's (its `created_at`, else when it was registered): that work
  was kept; the rest is *lost*. A live attempt's time so far is *running*: not decided yet.
- *Stalled*: from a STALLED replica's `stalled_since` (its last progress or sign of life) to
  its end, for the whole attempt; counted as stalled instead of productive or lost.
- *Idle* reservation: slots held while no attempt of the trial ran: the trial STARTING
  (placement, environment build, launch, the wait for check-ins) or RESTARTING (between
  attempts), from its state changes. A warm standby holds no slot and counts nothing.
- *Queued*: hours trials waited QUEUED (from their state changes; they hold no slots, so
  these are trial-hours, not in `slot_hours`).
- `slot_hours` = productive + lost + stalled + idle + running;
  `goodput` = productive / (productive + lost + stalled + idle), None while that is 0.

Cheap whatever the history: four queries, one row per trial or attempt at most (the trials
with time in the window; their attempts that ran in it, each with its kept checkpoint's
time; the stalled replicas; each trial's queued and idle seconds, which the database sums
over its state changes with a window function), then sums in Python (`split_attempt`,
pure). `since` is bounded (`MAX_SINCE_S`), and so are the rows a report lists
(`MAX_ROWS`, the groups with most slot-hours first).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import (
    ColumnElement,
    Select,
    Subquery,
    and_,
    case,
    func,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import Session, aliased

from muster import api
from muster.config.units import parse_duration
from muster.errors import InvalidRequest, NotFound
from muster.services.access import Principal
from muster.states import AttemptState, Role, TrialState, UsageBy, values
from muster.store import Attempt, Checkpoint, Event, Experiment, Replica, Store, Trial, User
from muster.store.models import now

__all__ = ["DEFAULT_SINCE", "MAX_ROWS", "MAX_SINCE_S", "NONE_KEY", "AttemptTime", "Seconds",
           "report_scope", "split_attempt", "usage_report", "window_seconds"]

DEFAULT_SINCE = "30d"
MAX_SINCE_S = 400 * 86400.0  # a report reaches back at most this far
MAX_ROWS = 500  # groups a report lists (the most slot-hours first)
NONE_KEY = "(none)"  # the group of experiments without an owner, or without labels
HOUR = 3600.0
# The trial states in which it holds its slots while no attempt of it runs.
_IDLE = frozenset({TrialState.STARTING, TrialState.RESTARTING})

Interval = tuple[float, float]


@dataclass(frozen=True)
class AttemptTime:
    """An attempt as usage sees it: when it ran, how much of it was kept, its stalls."""

    start: float
    end: float | None  # None: it still runs
    # Productive up to here: +inf (it succeeded), a checkpoint's time, -inf (nothing kept).
    kept_until: float
    stalls: tuple[Interval, ...] = ()  # (stalled_since, the stalled replica's end)


@dataclass
class Seconds:
    """Slot-seconds by kind (one slot: multiply by the slots), and queued trial-seconds."""

    productive: float = 0.0
    lost: float = 0.0
    stalled: float = 0.0
    idle: float = 0.0
    running: float = 0.0
    queued: float = 0.0

    @property
    def held(self) -> float:
        """The time its slots were held, whatever for."""
        return self.productive + self.lost + self.stalled + self.idle + self.running

    def add(self, other: Seconds, weight: float = 1.0) -> None:
        """Add `other`'s slot-seconds times `weight` (slots), and its queued seconds."""
        self.productive += other.productive * weight
        self.lost += other.lost * weight
        self.stalled += other.stalled * weight
        self.idle += other.idle * weight
        self.running += other.running * weight
        self.queued += other.queued


def split_attempt(attempt: AttemptTime, since: float, until: float) -> Seconds:
    """What one slot of `attempt` spent inside the window [since, until]."""
    end = until if attempt.end is None else attempt.end
    lo, hi = max(attempt.start, since), min(end, until)
    if hi <= lo:
        return Seconds()
    stalls = _merged((max(a, lo), min(b, hi)) for a, b in attempt.stalls)
    stalled = sum(b - a for a, b in stalls)
    if attempt.end is None:
        return Seconds(stalled=stalled, running=hi - lo - stalled)
    cut = min(max(attempt.kept_until, lo), hi)
    return Seconds(productive=cut - lo - _covered(lo, cut, stalls),
                   lost=hi - cut - _covered(cut, hi, stalls), stalled=stalled)


def _merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The non-empty intervals, merged where they overlap, in order."""
    merged: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _covered(lo: float, hi: float, intervals: Sequence[Interval]) -> float:
    """How much of [lo, hi] the (disjoint) intervals cover."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


def window_seconds(since: str) -> float:
    """Seconds of `since` ("30d", "12h", "90m"), bounded by `MAX_SINCE_S`.

    Raises:
        InvalidRequest: not a duration, zero, or longer than the bound.
    """
    try:
        seconds = parse_duration(since, "since")
    except ValueError as exc:
        raise InvalidRequest(f"{exc}; e.g. 30d, 12h or 90m") from None
    if not 0 < seconds <= MAX_SINCE_S:
        raise InvalidRequest(f"since must be more than 0 and at most {MAX_SINCE_S / 86400:.0f}d "
                             f"(a report reaches back at most that far), got {since!r}")
    return seconds


def report_scope(who: Principal, user: str | None, everyone: bool) -> str | None:
    """Whose experiments a report counts (a user's name; None: everyone's): `user` when
    given, everyone's when asked; by default a user's own, and everyone's for admins and
    viewers (a viewer owns none).

    Raises:
        InvalidRequest: both `user` and `everyone`.
    """
    if user is not None and everyone:
        raise InvalidRequest("give either user (one user's experiments) or everyone, not both")
    if user is not None:
        return user
    return who.name if who.role is Role.USER and not everyone else None


@dataclass(frozen=True)
class _TrialFacts:
    id: int
    experiment_id: int
    experiment_name: str
    owner: str | None
    labels: tuple[str, ...]
    state: TrialState
    early_stopped: bool
    slots: int
    gpus: int

    def keys(self, by: UsageBy) -> list[tuple[str, str]]:
        """The (key, name) of each group the trial counts in."""
        if by is UsageBy.EXPERIMENT:
            return [(str(self.experiment_id), self.experiment_name)]
        if by is UsageBy.USER:
            owner = self.owner or NONE_KEY
            return [(owner, owner)]
        return [(label, label) for label in sorted(set(self.labels))] or [(NONE_KEY, NONE_KEY)]


@dataclass
class _Group:
    """The sums of one row: slot-seconds by kind, GPU-seconds, counts."""

    name: str
    slot: Seconds = field(default_factory=Seconds)
    gpu_seconds: float = 0.0
    trials: int = 0
    attempts: int = 0

    def add(self, trial: _TrialFacts, spent: Seconds, attempts: int) -> None:
        """Add one slot's `spent` of `trial`, times its slots (and its GPUs)."""
        self.slot.add(spent, trial.slots)
        self.gpu_seconds += spent.held * trial.gpus
        self.trials += 1
        self.attempts += attempts

    def row(self, key: str) -> api.UsageRow:
        s = self.slot
        decided = s.productive + s.lost + s.stalled + s.idle
        return {"key": key, "name": self.name, "slot_hours": s.held / HOUR,
                "gpu_hours": self.gpu_seconds / HOUR, "productive_hours": s.productive / HOUR,
                "lost_hours": s.lost / HOUR, "stalled_hours": s.stalled / HOUR,
                "idle_hours": s.idle / HOUR, "running_hours": s.running / HOUR,
                "queued_hours": s.queued / HOUR,
                "goodput": s.productive / decided if decided > 0 else None,
                "trials": self.trials, "attempts": self.attempts}


def usage_report(store: Store, who: Principal, *, by: UsageBy = UsageBy.USER,
                 since: str = DEFAULT_SINCE, user: str | None = None,
                 everyone: bool = False) -> api.UsageReport:
    """Usage of the last `since`, by `by`: one row per group, the most slot-hours first.

    Raises:
        InvalidRequest: a bad `since`, or both `user` and `everyone`.
        NotFound: `user` names no user.
    """
    seconds = window_seconds(since)
    owner = report_scope(who, user, everyone)
    until = now()
    start = until - seconds
    with store.session_scope() as s:
        scope = _scope(_owner_id(s, owner), start, until)
        groups, total = _sum(s, _trials(s, scope), scope, by, start, until)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1].slot.held, kv[0]))
    return {"by": by, "since": start, "until": until, "owner": owner,
            "rows": [group.row(key) for key, group in ordered[:MAX_ROWS]],
            "more_rows": max(0, len(ordered) - MAX_ROWS), "total": total.row("total")}


def _owner_id(s: Session, owner: str | None) -> int | None:
    if owner is None:
        return None
    found = s.scalar(select(User.id).where(User.name == owner))
    if found is None:
        raise NotFound(f"user {owner!r} does not exist; `muster user list` shows the users")
    return found


def _scope(owner_id: int | None, since: float, until: float) -> Select[int]:
    """The ids of the trials with time in the window (they existed, and had not ended before
    it): the other queries' subquery."""
    found = [Trial.created_at < until, or_(Trial.ended_at.is_(None), Trial.ended_at > since)]
    if owner_id is not None:
        found.append(Experiment.owner_id == owner_id)
    return select(Trial.id).join(Experiment, Trial.experiment_id == Experiment.id).where(*found)


def _trials(s: Session, scope: Select[int]) -> dict[int, _TrialFacts]:
    """The trials in scope, with what each takes (from the stored config, in the query)."""
    resources = Experiment.config["resources"]
    replicas = func.coalesce(resources["replicas"].as_integer(), 1)
    gpus = func.coalesce(resources["gpus_per_replica"].as_integer(), 0)
    query = scope.add_columns(Trial.experiment_id, Experiment.name, User.name,
                              Experiment.labels, Trial.state, Trial.early_stopped, replicas,
                              gpus).outerjoin(User, Experiment.owner_id == User.id)
    return {row[0]: _TrialFacts(row[0], row[1], row[2], row[3], tuple(row[4] or ()), row[5],
                                bool(row[6]), row[7], row[7] * row[8])
            for row in s.execute(query)}


@dataclass(frozen=True)
class _AttemptRow:
    number: int
    state: AttemptState
    started_at: float
    ended_at: float | None
    kept_at: float | None  # its latest checkpoint a later attempt resumed from: its time


def _sum(s: Session, trials: dict[int, _TrialFacts], scope: Select[int], by: UsageBy,
         since: float, until: float) -> tuple[dict[str, _Group], _Group]:
    """Each group's sums and the total (every trial once), from three more queries."""
    attempts, stalls = _attempts(s, scope, since, until), _stalls(s, scope)
    waits = _waits(s, scope, since, until)
    groups: dict[str, _Group] = {}
    total = _Group("total")
    for trial in trials.values():
        spent, counted = _trial_seconds(trial, attempts.get(trial.id, []), stalls, since,
                                        until)
        spent.queued, spent.idle = waits.get(trial.id, (0.0, 0.0))
        if spent.held == 0 and spent.queued == 0:
            continue  # it existed, and did nothing in the window (PAUSED throughout)
        total.add(trial, spent, counted)
        for key, name in trial.keys(by):
            groups.setdefault(key, _Group(name)).add(trial, spent, counted)
    return groups, total


def _trial_seconds(trial: _TrialFacts, attempts: list[_AttemptRow],
                   stalls: dict[tuple[int, int], list[Interval]], since: float,
                   until: float) -> tuple[Seconds, int]:
    """One slot's seconds of the trial's attempts by kind, and how many ran in the window."""
    spent, counted = Seconds(), 0
    last = max((a.number for a in attempts), default=0)
    for attempt in attempts:
        part = split_attempt(AttemptTime(
            attempt.started_at, attempt.ended_at, _kept_until(trial, attempt, last),
            tuple(stalls.get((trial.id, attempt.number), ()))), since, until)
        spent.add(part)
        counted += part.held > 0
    return spent, counted


def _kept_until(trial: _TrialFacts, attempt: _AttemptRow, last: int) -> float:
    """Up to when the attempt's work was kept (`AttemptTime.kept_until`)."""
    if attempt.state is AttemptState.SUCCEEDED:
        return math.inf
    if (attempt.number == last and trial.early_stopped
            and trial.state is TrialState.SUCCEEDED):
        return math.inf  # the searcher stopped it early: its result is the trial's
    return -math.inf if attempt.kept_at is None else attempt.kept_at


def _attempts(s: Session, scope: Select[int], since: float, until: float
              ) -> dict[int, list[_AttemptRow]]:
    """The attempts of the trials in scope that ran in the window, by trial, each with the
    time of its latest checkpoint a later attempt resumed from."""
    kept = _kept(scope)
    query = (select(Attempt.trial_id, Attempt.number, Attempt.state, Attempt.started_at,
                    Attempt.ended_at, kept.c.at)
             .outerjoin(kept, and_(kept.c.trial_id == Attempt.trial_id,
                                   kept.c.attempt == Attempt.number))
             .where(Attempt.trial_id.in_(scope), Attempt.started_at.is_not(None),
                    Attempt.started_at < until,
                    or_(Attempt.ended_at.is_(None), Attempt.ended_at > since)))
    found: dict[int, list[_AttemptRow]] = defaultdict(list)
    for trial_id, number, state, started_at, ended_at, kept_at in s.execute(query):
        found[trial_id].append(_AttemptRow(number, state, cast(float, started_at),  # NOT NULL
                                           ended_at, kept_at))
    return found


def _kept(scope: Select[int]) -> Subquery:
    """(trial_id, attempt, at): the time of each attempt's latest checkpoint that a later
    attempt of its trial resumed from (its `created_at`, else when it was registered)."""
    later = aliased(Attempt)
    return (select(Checkpoint.trial_id, Checkpoint.attempt,
                   func.max(func.coalesce(Checkpoint.created_at,
                                          Checkpoint.registered_at)).label("at"))
            .join(later, and_(later.trial_id == Checkpoint.trial_id,
                              later.resumed_from == Checkpoint.name,
                              later.number > Checkpoint.attempt))
            .where(Checkpoint.trial_id.in_(scope))
            .group_by(Checkpoint.trial_id, Checkpoint.attempt).subquery())


def _stalls(s: Session, scope: Select[int]) -> dict[tuple[int, int], list[Interval]]:
    """(trial, attempt) → its stalls: each STALLED replica's start of stall and end."""
    query = (select(Attempt.trial_id, Attempt.number, Replica.stalled_since, Replica.ended_at)
             .join(Replica, Replica.attempt_id == Attempt.id)
             .where(Attempt.trial_id.in_(scope), Replica.stalled_since.is_not(None),
                    Replica.ended_at.is_not(None)))
    found: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for trial_id, number, since, ended_at in s.execute(query):
        found[(trial_id, number)].append((cast(float, since), cast(float, ended_at)))
    return found


def _waits(s: Session, scope: Select[int], since: float, until: float
           ) -> dict[int, tuple[float, float]]:
    """trial → (seconds QUEUED, seconds holding its slots while no attempt ran: STARTING or
    RESTARTING) inside the window, summed by the database over the trial's timeline: QUEUED
    from its creation, then each recorded state change, each until the next (or `until`)."""
    created = select(Trial.id.label("trial_id"), literal(TrialState.QUEUED.value).label("state"),
                     Trial.created_at.label("at"), literal(0).label("seq")
                     ).where(Trial.id.in_(scope))
    moved = select(Event.trial_id, Event.to_state, Event.at, Event.id).where(
        Event.trial_id.in_(scope), Event.entity == "trial", Event.to_state.is_not(None))
    timeline = union_all(created, moved).subquery()
    stop = func.lead(timeline.c.at, 1, until).over(partition_by=timeline.c.trial_id,
                                                   order_by=(timeline.c.at, timeline.c.seq))
    spans = select(timeline.c.trial_id, timeline.c.state,
                   _later(timeline.c.at, since).label("lo"),
                   _earlier(stop, until).label("hi")).subquery()
    seconds = func.sum(case((spans.c.hi > spans.c.lo, spans.c.hi - spans.c.lo), else_=0.0))
    waiting = case((spans.c.state == TrialState.QUEUED.value, 0), else_=1).label("idle")
    query = (select(spans.c.trial_id, waiting, seconds)
             .where(spans.c.state.in_(values([TrialState.QUEUED, *_IDLE])))
             .group_by(spans.c.trial_id, waiting))
    found: dict[int, tuple[float, float]] = {}
    for trial_id, idle, total in s.execute(query):
        queued, held = found.get(trial_id, (0.0, 0.0))
        found[trial_id] = (queued, held + total) if idle else (queued + total, held)
    return found


def _later(column: ColumnElement[float], bound: float) -> ColumnElement[float]:
    """The later of `column` and `bound`, in SQL both databases speak."""
    return case((column > bound, column), else_=literal(bound))


def _earlier(column: ColumnElement[float], bound: float) -> ColumnElement[float]:
    return case((column < bound, column), else_=literal(bound))
