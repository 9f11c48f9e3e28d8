"""Who starts now: RESTARTING trials' next attempts, QUEUED trials the scheduler admits,
preemption, and the disk guard that holds every new launch while space is low.

The decisions are `muster.schedule.plan.plan`'s (pure); this module gathers its input from
the store in one transaction per pass and carries the plan out.

A queue of 10,000 trials (issue 19) must not cost every pass what it holds. The queue is
read as a few columns, never as ORM objects, and what an experiment's trials need (its
resources, its environment) is read from its stored config once and kept by its id: a
stored config never changes. A pass after a quiet one (nothing started, restarted,
preempted or failed, no queue reason to write, nothing waiting for an environment) first
compares what `plan` would start from with what the quiet pass saw: a digest of every
waiting trial's id, state, priority and kill request that the database builds from an index,
the holdings, the capacity and the environments. Equal, `plan` (pure) would decide as it
did, and the pass would change nothing either: it stops there. Queue reasons need no
comparing: only the supervisor writes them (here; and the data scan, the GPU pool and a
placement that reserves, for trials that make a pass not quiet).

Quotas (`muster.schedule.quotas`) are read in the transaction that reads the queue and the
holdings, and handed to `plan` with them: what the running trials hold and what `plan`
admits are counted from one view, so no pass admits trials that exceed a quota together.
A changed quota (an admin's `muster quota set`, a new group member) is part of what a
quiet pass compares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TypeVar, cast

from sqlalchemy import BigInteger, Integer, String, Table, bindparam, case, func, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session

from muster.config.quotas import QuotasConfig
from muster.priority import MAX_PRIORITY
from muster.schedule.disk import disk_shortfall
from muster.schedule.plan import Capacity, Demand, Holding, plan
from muster.schedule.quota_book import read_book
from muster.schedule.quotas import Charge, QuotaBook
from muster.states import EnvironmentState, EventReason, StopIntent, TrialState, values
from muster.store import Experiment, Trial, record_event
from muster.store.configs import experiment_config, experiment_resources
from muster.supervise.context import ACTOR, SupervisorContext
from muster.supervise.ending import pause, record_decision
from muster.supervise.environments import EnvironmentGate, QueuedTrial, Sorted
from muster.supervise.isolation import Isolation
from muster.supervise.launching import GpuPlan
from muster.supervise.outcome import Move, Next

__all__ = ["Admission"]

Start = Callable[[int, GpuPlan], None]  # start an attempt of a trial, on these GPUs


class _TrialRow(Protocol):
    @property
    def id(self) -> int: ...


Row = TypeVar("Row", bound=_TrialRow)
Need = TypeVar("Need", Demand, Holding)
_READ_AT_ONCE = 1000  # experiments per query, when their needs are read


class _Waiting(NamedTuple):
    """A QUEUED or RESTARTING trial, as admission reads it."""

    id: int
    experiment_id: int
    state: str
    priority: int
    stop_requested: bool
    queue_reason: str | None


class _Holder(NamedTuple):
    """A trial that holds resources (started, running, or between attempts)."""

    id: int
    experiment_id: int
    priority: int
    stop_requested: bool
    stop_intent: StopIntent | None


class _Resources(NamedTuple):
    """What each trial of an experiment takes (its config's `resources`, the part kept)."""

    replicas: int
    gpus_per_replica: int
    gpu_type: str | None
    max_slots: int | None


@dataclass(frozen=True)
class _Needs:
    """What an experiment's trials need to start, from its stored config."""

    environment_key: str | None
    resources: _Resources | None  # None: the config cannot be read (`error` says why)
    error: Exception | None = None
    owner_id: int | None = None  # whose quotas its trials count against


@dataclass(frozen=True)
class _Seen:
    """What `plan` started from in a pass: a later pass that sees the same plans the same."""

    queue: str | None  # `_queue_digest`
    holdings: tuple[Holding, ...]
    capacity: Capacity
    preemption: bool
    environments: frozenset[str]  # those the queued trials need (all built, when quiet)
    quotas: QuotaBook  # what the owners of the queued trials may hold


@dataclass(frozen=True)
class _Queue:
    """What one pass's admission starts from, read in one transaction."""

    restarting: list[int]
    demands: list[Demand]
    shown: dict[int, str | None]  # trial id -> the queue reason it shows now
    environments: Sorted  # the queued trials by where their environments stand
    seen: _Seen

    @property
    def steady(self) -> bool:
        """Nothing restarts, and no queued trial waits for its environment."""
        return not (self.restarting or self.environments.waiting
                    or self.environments.failed)


@dataclass
class Admission:
    ctx: SupervisorContext
    start: Start
    isolation: Isolation
    quotas: QuotasConfig = field(default_factory=QuotasConfig)  # the cluster config's
    _disk_warning: str | None = field(default=None, init=False)
    _gate: EnvironmentGate = field(init=False)
    _needs: dict[int, _Needs] = field(default_factory=dict, init=False)  # by experiment id
    _demands: dict[int, Demand] = field(default_factory=dict, init=False)  # by trial id
    _quiet: _Seen | None = field(default=None, init=False)  # what the last quiet pass saw

    def __post_init__(self) -> None:
        self._gate = EnvironmentGate(self.ctx)

    def admit(self, slots: int, preemption: bool) -> None:
        """Start the next attempts of RESTARTING trials (they keep what they hold), then the
        QUEUED trials the scheduler admits (priority, then first come, first served; whole
        replica sets; slots and GPUs); note why the others wait; preempt where it says so."""
        if self._unchanged(slots, preemption):
            return
        self._quiet = None
        broken: list[tuple[int, Exception]] = []
        queue = self._read(slots, preemption, broken)
        for trial_id, exc in broken:
            self.isolation.trial_failed(trial_id, "reading what it needs to start", exc)
        self._gate.fail(queue.environments.failed)
        for trial_id in queue.restarting:
            if self._may_restart(trial_id):
                self.start(trial_id, ())
        demands = self._start_overflow(queue.demands, slots)
        decided = None
        if demands:
            decided = plan(demands, queue.seen.holdings, queue.seen.capacity, preemption,
                           queue.seen.quotas)
            for admit in decided.admit:
                self.start(admit.trial_id, admit.gpus)
        waiting = {**queue.environments.waiting, **(decided.waiting if decided else {})}
        written = self._note_waiting(waiting, queue.shown)
        for victim, beneficiary in (decided.preempt.items() if decided else ()):
            self._preempt(victim, beneficiary)
        if (decided is not None and not (decided.admit or decided.preempt or written or broken)
                and queue.steady and len(demands) == len(queue.demands)):
            self._quiet = queue.seen  # a pass that changed nothing

    def may_start_new(self, s: Session, trial: Trial, slots: int) -> bool:
        """Whether a trial created in the caller's transaction (not committed yet) may start
        at once, recorded in that same transaction (`Supervisor.admitting_new`): the plain
        case alone, which `plan` would admit the same way. Where the placement reserves
        nothing (no wait that `plan` does not foresee), while the disk guard is off: a
        single-trial experiment without GPUs, data to scan or an environment still to
        build; no trial waits ahead of it in the queue's order
        (priority, then id: so no preemption has a say, and in a batch each trial sees the
        ones before it admitted or waiting); its owner has no quota that limits what runs
        (the pass counts those); and its replicas fit in the slots free now.
        Anything else waits for the pass, as every trial did before. The caller holds the
        lock that keeps the pass's admission out meanwhile."""
        experiment = trial.experiment
        if (self.ctx.placement.reserves or self._disk_warning is not None
                or experiment.max_trials != 1):
            return False
        config = experiment_config(experiment)
        resources = config.resources
        if (config.data is not None or resources.gpus_per_replica or resources.gpu_type
                or resources.max_slots is not None):
            return False
        key = experiment.environment_key
        if key is not None and self.ctx.envs.layout.built(key) is None:
            return False
        if _waiting_ahead(s, trial.priority, trial.id):
            return False
        if read_book(s, self.quotas).limits_running(experiment.owner_id):
            return False
        holders = _holders(s)
        needs = self._needs_of(s, {h.experiment_id for h in holders})
        broken: list[tuple[int, Exception]] = []
        used = sum(h.slots for h in _each(
            holders, lambda h: _holding(h, needs[h.experiment_id], (), False), broken))
        return not broken and used + resources.replicas <= slots

    def queue_waits(self, priority: int) -> bool:
        """Whether a trial of `priority` created now would wait behind one in the queue
        (QUEUED or RESTARTING, of that priority or better: a new trial's id is the
        highest), so that a create need not take the admission's lock to know it."""
        with self.ctx.store.session_scope() as s:
            return _waiting_ahead(s, priority, None)

    def slots_in_use(self) -> int:
        """One slot per replica without GPUs of every trial that holds its resources
        (started, or between attempts); replicas with GPUs take GPUs instead."""
        with self.ctx.store.session_scope() as s:
            holders = _holders(s)
            needs = self._needs_of(s, {h.experiment_id for h in holders})
            by_slot = self.ctx.placement.places_gpus
            return sum(_holding(h, needs[h.experiment_id], (), by_slot).slots for h in holders)

    def disk_low(self, min_free_disk: int) -> bool:
        """The disk guard: below `min_free_disk` nothing new launches. Queued trials show the
        reason; running ones get one warning event each time the guard trips."""
        shortfall = disk_shortfall(self.ctx.home.runs_dir, min_free_disk)
        # While low, every pass: a trial queued since the guard tripped shows why it waits,
        # and the free space in the reason changes. The warning is for the trip alone.
        if shortfall is not None or self._disk_warning is not None:
            self._quiet = None  # the guard writes queue reasons
            self._note_disk(shortfall, tripped=self._disk_warning is None)
        self._disk_warning = shortfall
        return shortfall is not None

    def _unchanged(self, slots: int, preemption: bool) -> bool:
        """Whether `plan` would start from what the last quiet pass saw (see the module's
        docstring). Never where the placement reserves: its waits write queue reasons."""
        quiet = self._quiet
        if quiet is None or self.ctx.placement.reserves:
            return False
        if any(self.ctx.envs.state(key).state is not EnvironmentState.READY
               for key in quiet.environments):
            return False
        broken: list[tuple[int, Exception]] = []
        with self.ctx.store.session_scope() as s:
            digest = _queue_digest(s)
            if digest != quiet.queue:
                return False
            holdings = tuple(self._holdings(s, broken))
            capacity = Capacity(slots, self.ctx.placement.pool.slots(s))
            quotas = read_book(s, self.quotas)
        return not broken and quiet == _Seen(digest, holdings, capacity, preemption,
                                             quiet.environments, quotas)

    def _read(self, slots: int, preemption: bool, broken: list[tuple[int, Exception]]
              ) -> _Queue:
        """The queue; a trial whose config cannot be read goes to `broken` instead."""
        with self.ctx.store.session_scope() as s:
            # First: a change after it makes the next pass's digest differ.
            digest = None if self.ctx.placement.reserves else _queue_digest(s)
            rows = _waiting_trials(s)
            needs = self._needs_of(s, {row.experiment_id for row in rows})
            queued = [row for row in rows if row.state == TrialState.QUEUED]
            environments = self._gate.sort(
                QueuedTrial(row.id, needs[row.experiment_id].environment_key,
                            row.stop_requested) for row in queued)
            demands = self._queued_demands(queued, set(environments.ready), needs, broken)
            holdings = self._holdings(s, broken) if demands else []
            capacity = Capacity(slots, self.ctx.placement.pool.slots(s) if demands else ())
            quotas = read_book(s, self.quotas) if demands else QuotaBook()
        self._forget_all_but({row.experiment_id for row in rows}
                             | {h.experiment_id for h in holdings})
        wanted = {d.trial_id for d in demands}
        built = frozenset(key for row in queued if not row.stop_requested
                          and (key := needs[row.experiment_id].environment_key) is not None)
        return _Queue(
            restarting=[row.id for row in rows if row.state == TrialState.RESTARTING],
            demands=demands,
            shown={row.id: row.queue_reason for row in queued
                   if row.id in wanted or row.id in environments.waiting},
            environments=environments,
            seen=_Seen(digest, tuple(holdings), capacity, preemption, built, quotas))

    def _queued_demands(self, queued: list[_Waiting], ready: set[int],
                        needs: dict[int, _Needs], broken: list[tuple[int, Exception]]
                        ) -> list[Demand]:
        """What each queued trial whose environment is ready needs, in queue order; each
        kept for the next pass (only its priority can change)."""
        known = self._demands

        def demand(row: _Waiting) -> Demand:
            found = known.get(row.id)
            if found is not None and found.priority == row.priority:
                return found
            return _demand(row, needs[row.experiment_id],
                           by_slot=self.ctx.placement.places_gpus)

        demands = _each([row for row in queued if row.id in ready], demand, broken)
        self._demands = {d.trial_id: d for d in demands}
        return demands

    def _holdings(self, s: Session, broken: list[tuple[int, Exception]]) -> list[Holding]:
        """What each trial that holds resources holds (by trial id)."""
        held = self.ctx.placement.pool.held(s)
        holders = _holders(s)
        needs = self._needs_of(s, {h.experiment_id for h in holders})
        by_slot = self.ctx.placement.places_gpus
        return _each(holders, lambda h: _holding(h, needs[h.experiment_id],
                                                 held.get(h.id, ()), by_slot), broken)

    def _needs_of(self, s: Session, experiment_ids: Iterable[int]) -> dict[int, _Needs]:
        """Each experiment's needs (and any others known): kept, or read from its config."""
        missing = [i for i in experiment_ids if i not in self._needs]
        for start in range(0, len(missing), _READ_AT_ONCE):
            for experiment_id, key, uuid, stored, owner_id in s.execute(
                    select(Experiment.id, Experiment.environment_key, Experiment.uuid,
                           Experiment.config, Experiment.owner_id)
                    .where(Experiment.id.in_(missing[start:start + _READ_AT_ONCE]))):
                self._needs[experiment_id] = _read_needs(key, uuid, stored, owner_id)
        return self._needs

    def _forget_all_but(self, experiment_ids: set[int]) -> None:
        """Keep the needs of these experiments only (those of the queue and the holders)."""
        if len(self._needs) > len(experiment_ids):
            self._needs = {i: n for i, n in self._needs.items() if i in experiment_ids}

    def _start_overflow(self, demands: list[Demand], slots: int) -> list[Demand]:
        """Where the capacity may grow (a cluster's autoscaler), start the trials with more
        replicas than it has slots now: their placement is asked for, and waits, then fails
        as CAPACITY. Returns the others, for `plan`."""
        if not self.ctx.placement.may_grow:
            return demands
        for demand in [d for d in demands if d.replicas > slots]:
            self.start(demand.trial_id, ())
        return [d for d in demands if d.replicas <= slots]

    def _note_waiting(self, waiting: dict[int, str], shown: dict[int, str | None]) -> bool:
        """Write the queue reasons that changed (positions shift whenever the head starts),
        in one statement, and only for trials still QUEUED. True when there were some."""
        changed = [{"waiting_id": trial_id, "waiting_reason": reason}
                   for trial_id, reason in waiting.items() if shown[trial_id] != reason]
        if changed:
            with self.ctx.store.session_scope() as s:
                trials = cast(Table, Trial.__table__)
                s.connection().execute(
                    update(trials).where(trials.c.id == bindparam("waiting_id"),
                                         trials.c.state == TrialState.QUEUED)
                    .values(queue_reason=bindparam("waiting_reason")), changed)
        return bool(changed)

    def _may_restart(self, trial_id: int) -> bool:
        """False when the trial's next attempt must not start now: it is being paused or
        preempted (it goes PAUSED instead), or its GPUs still hold the last attempt's
        memory."""
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if trial.state != TrialState.RESTARTING:
                return False
            intent = trial.intent
            if intent in StopIntent.pausing():
                assert intent is not None
                pause(s, trial, Move(Next.PAUSE, intent.event_reason,
                                     "paused between two attempts"), intent)
                return False
            pool = self.ctx.placement.pool
            return intent is StopIntent.KILL or pool.released_for_restart(s, trial)

    def _preempt(self, trial_id: int, for_trial_id: int) -> None:
        """Stop a trial to make room for a waiting one of better priority. It goes back to
        the queue and resumes from its latest checkpoint; not a failure, no restart counted.
        The next pass stops its replicas (SIGTERM, `stop_grace`, so it can checkpoint)."""
        with self.ctx.store.session_scope() as s:
            trial, waiting = s.get_one(Trial, trial_id), s.get_one(Trial, for_trial_id)
            if not trial.state.is_active() or trial.intent is not None:
                return
            trial.stop_intent = StopIntent.PREEMPT
            record_decision(s, trial, EventReason.PREEMPTED,
                            f"preempted by trial {waiting.id} (priority {waiting.priority}, "
                            f"better than this trial's {trial.priority}); it goes back to the "
                            "queue and resumes from its latest checkpoint")

    def _note_disk(self, shortfall: str | None, tripped: bool) -> None:
        with self.ctx.store.session_scope() as s:
            if shortfall is not None and tripped:  # the engagement itself, once (notified)
                record_event(s, entity="cluster", entity_id=0, reason=EventReason.DISK_LOW,
                             actor=ACTOR, message=f"the disk guard engaged: {shortfall}")
            not_ended = [TrialState.QUEUED, *TrialState.active()]
            for trial in s.scalars(select(Trial).where(Trial.state.in_(values(not_ended)))):
                if trial.state == TrialState.QUEUED:
                    trial.queue_reason = shortfall
                elif shortfall is not None and tripped:
                    record_event(s, entity="trial", entity_id=trial.id,
                                 reason=EventReason.DISK_LOW, actor=ACTOR, message=shortfall,
                                 experiment_id=trial.experiment_id, trial_id=trial.id)


def _queue_digest(s: Session) -> str | None:
    """Every QUEUED and RESTARTING trial as one number, its id, priority, kill request and
    state packed (one to one: a priority is 1 to `MAX_PRIORITY`), the numbers joined into one
    text by the database from `ix_trials_queue` alone: equal texts, equal rows. None for an
    empty queue. (A number per row: joining each column's text cost ten times as much.)"""
    packed = (((sql_cast(Trial.id, BigInteger) * (MAX_PRIORITY + 1) + Trial.priority) * 2
               + sql_cast(Trial.stop_requested, Integer)) * 2
              + case((Trial.state == TrialState.RESTARTING, 1), else_=0))
    return s.scalar(select(func.aggregate_strings(sql_cast(packed, String), ","))
                    .where(Trial.state.in_(values(TrialState.waiting()))))


def _waiting_ahead(s: Session, priority: int, trial_id: int | None) -> bool:
    """Whether a QUEUED or RESTARTING trial comes before (`priority`, `trial_id`) in the
    queue's order (priority, then id); `trial_id` None: a trial not created yet (the
    highest id), so every waiting trial of `priority` or better."""
    before = Trial.priority <= priority if trial_id is None else (
        (Trial.priority < priority) | ((Trial.priority == priority) & (Trial.id < trial_id)))
    waiting = Trial.state.in_(values(TrialState.waiting()))
    return s.scalar(select(Trial.id).where(waiting, before).limit(1)) is not None


def _waiting_trials(s: Session) -> list[_Waiting]:
    """The QUEUED and RESTARTING trials, in queue order (priority, then id)."""
    return [_Waiting._make(row) for row in s.execute(
        select(Trial.id, Trial.experiment_id, Trial.state, Trial.priority,
               Trial.stop_requested, Trial.queue_reason)
        .where(Trial.state.in_(values(TrialState.waiting()))).order_by(Trial.priority, Trial.id))]


def _holders(s: Session) -> list[_Holder]:
    """The trials that hold resources: started, running, or between attempts (by id)."""
    return [_Holder._make(row) for row in s.execute(
        select(Trial.id, Trial.experiment_id, Trial.priority, Trial.stop_requested,
               Trial.stop_intent)
        .where(Trial.state.in_(values(TrialState.active()))).order_by(Trial.id))]


def _read_needs(key: str | None, uuid: str, stored: dict[str, object],
                owner_id: int | None) -> _Needs:
    # Not kept whole (`experiment_resources`): 10,000 queued experiments would push the
    # running ones' configs out, and cost memory; the few fields admission uses are kept.
    try:
        resources = experiment_resources(uuid, stored)
    except Exception as exc:  # noqa: BLE001 - each of its trials is handed to the isolation
        return _Needs(key, None, exc, owner_id)
    return _Needs(key, _Resources(resources.replicas, resources.gpus_per_replica,
                                  resources.gpu_type, resources.max_slots), owner_id=owner_id)


def _resources(needs: _Needs) -> _Resources:
    if needs.resources is None:
        assert needs.error is not None
        raise needs.error
    return needs.resources


def _each(rows: Sequence[Row], read: Callable[[Row], Need],
          broken: list[tuple[int, Exception]]) -> list[Need]:
    """`read` of every trial's row; one that raises goes to `broken` (with its error)."""
    found = []
    for row in rows:
        try:
            found.append(read(row))
        except Exception as exc:  # noqa: BLE001 - handed to the isolation, which ends it
            broken.append((row.id, exc))
    return found


def _demand(row: _Waiting, needs: _Needs, by_slot: bool) -> Demand:
    # Where the placement places GPUs itself (Ray's placement group waits for them), each
    # replica takes a slot, one of the cluster's CPUs; its quotas count its GPUs all the same.
    resources = _resources(needs)
    charge = _charge(needs.owner_id, resources)
    if by_slot:
        return Demand(row.id, row.experiment_id, row.priority, resources.replicas,
                      max_slots=resources.max_slots, charge=charge)
    return Demand(row.id, row.experiment_id, row.priority, resources.replicas,
                  resources.gpus_per_replica, resources.gpu_type, resources.max_slots, charge)


def _charge(owner_id: int | None, resources: _Resources) -> Charge | None:
    """What a trial counts against its owner's quotas (one without an owner: nothing)."""
    if owner_id is None:
        return None
    return Charge.of(owner_id, resources.replicas, resources.gpus_per_replica)


def _holding(holder: _Holder, needs: _Needs, gpus: tuple[int, ...], by_slot: bool
             ) -> Holding:
    """What a running trial holds; `by_slot` (the placement places GPUs), a slot per
    replica."""
    resources = _resources(needs)
    intent = Trial.intent_of(holder.stop_requested, holder.stop_intent)
    return Holding(holder.id, holder.experiment_id, holder.priority, resources.replicas, gpus,
                   stopping=intent is not None,
                   gpus_per_replica=0 if by_slot else resources.gpus_per_replica,
                   charge=_charge(needs.owner_id, resources))
