"""Who starts now: RESTARTING trials' next attempts, QUEUED trials the scheduler admits,
preemption, and the disk guard that holds every new launch while space is low.

The decisions are `muster.schedule.plan.plan`'s (pure); this module gathers its input from
the store in one transaction per pass and carries the plan out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session, selectinload

from muster.schedule.disk import disk_shortfall
from muster.schedule.plan import Capacity, Demand, Holding, plan
from muster.states import EventReason, StopIntent, TrialState, values
from muster.store import Trial, record_event
from muster.supervise.configs import experiment_config
from muster.supervise.context import ACTOR, SupervisorContext
from muster.supervise.ending import pause, record_decision
from muster.supervise.environments import EnvironmentGate, Sorted
from muster.supervise.isolation import Isolation
from muster.supervise.launching import GpuPlan
from muster.supervise.outcome import Move, Next

__all__ = ["Admission"]

Start = Callable[[int, GpuPlan], None]  # start an attempt of a trial, on these GPUs
Need = TypeVar("Need", Demand, Holding)


@dataclass(frozen=True)
class _Queue:
    """What one pass's admission starts from, read in one transaction."""

    restarting: list[int]
    demands: list[Demand]
    shown: dict[int, str | None]  # trial id -> the queue reason it shows now
    holdings: list[Holding]
    capacity: Capacity
    environments: Sorted  # the queued trials by where their environments stand


@dataclass
class Admission:
    ctx: SupervisorContext
    start: Start
    isolation: Isolation
    _disk_warning: str | None = field(default=None, init=False)
    _gate: EnvironmentGate = field(init=False)

    def __post_init__(self) -> None:
        self._gate = EnvironmentGate(self.ctx)

    def admit(self, slots: int, preemption: bool) -> None:
        """Start the next attempts of RESTARTING trials (they keep what they hold), then the
        QUEUED trials the scheduler admits (priority, then first come, first served; whole
        replica sets; slots and GPUs); note why the others wait; preempt where it says so."""
        broken: list[tuple[int, Exception]] = []
        queue = self._read(slots, broken)
        for trial_id, exc in broken:
            self.isolation.trial_failed(trial_id, "reading what it needs to start", exc)
        self._gate.fail(queue.environments.failed)
        for trial_id in queue.restarting:
            if self._may_restart(trial_id):
                self.start(trial_id, ())
        waiting = dict(queue.environments.waiting)
        demands = queue.demands
        if self.ctx.launcher.on_cluster:
            # More replicas than the cluster has CPUs now: the cluster may grow (an
            # autoscaler), so its placement is asked for, and waits, then fails as CAPACITY.
            for demand in [d for d in demands if d.replicas > slots]:
                self.start(demand.trial_id, ())
            demands = [d for d in demands if d.replicas <= slots]
        decided = None
        if demands:
            decided = plan(demands, queue.holdings, queue.capacity, preemption)
            for admit in decided.admit:
                self.start(admit.trial_id, admit.gpus)
            waiting.update(decided.waiting)
        # One statement for every reason that changed (positions shift whenever the head
        # starts), and only for trials still QUEUED.
        changed = [{"waiting_id": trial_id, "waiting_reason": reason}
                   for trial_id, reason in waiting.items()
                   if queue.shown[trial_id] != reason]
        if changed:
            with self.ctx.store.session_scope() as s:
                trials = cast(Table, Trial.__table__)
                s.connection().execute(
                    update(trials).where(trials.c.id == bindparam("waiting_id"),
                                         trials.c.state == TrialState.QUEUED.value)
                    .values(queue_reason=bindparam("waiting_reason")), changed)
        for victim, beneficiary in (decided.preempt.items() if decided else ()):
            self._preempt(victim, beneficiary)

    def slots_in_use(self) -> int:
        """One slot per replica without GPUs of every trial that holds its resources
        (started, or between attempts); replicas with GPUs take GPUs instead."""
        with self.ctx.store.session_scope() as s:
            cluster = self.ctx.launcher.on_cluster
            return sum(_holding(t, (), cluster).slots for t in _holders(s))

    def disk_low(self, min_free_disk: int) -> bool:
        """The disk guard: below `min_free_disk` nothing new launches. Queued trials show the
        reason; running ones get one warning event each time the guard trips."""
        shortfall = disk_shortfall(self.ctx.home.runs_dir, min_free_disk)
        # While low, every pass: a trial queued since the guard tripped shows why it waits,
        # and the free space in the reason changes. The warning is for the trip alone.
        if shortfall is not None or self._disk_warning is not None:
            self._note_disk(shortfall, tripped=self._disk_warning is None)
        self._disk_warning = shortfall
        return shortfall is not None

    def _read(self, slots: int, broken: list[tuple[int, Exception]]) -> _Queue:
        """The queue; a trial whose config cannot be read goes to `broken` instead."""
        with self.ctx.store.session_scope() as s:
            trials = list(s.scalars(
                select(Trial).options(selectinload(Trial.experiment))
                .where(Trial.state.in_([TrialState.QUEUED.value, TrialState.RESTARTING.value]))
                .order_by(Trial.priority, Trial.id)))
            environments = self._gate.sort([t for t in trials if t.state == TrialState.QUEUED])
            queued = environments.ready
            # On a cluster, Ray places GPUs (the placement group waits for them): each
            # replica takes a slot, one of the cluster's CPUs.
            demand = _cluster_demand if self.ctx.launcher.on_cluster else _demand
            demands = _each(queued, demand, broken)
            held = self.ctx.pool.held(s) if demands else {}
            cluster = self.ctx.launcher.on_cluster
            holdings = (_each(list(_holders(s)),
                              lambda t: _holding(t, held.get(t.id, ()), cluster),
                              broken) if demands else [])
            wanted = {d.trial_id for d in demands}
            return _Queue(
                restarting=[t.id for t in trials if t.state == TrialState.RESTARTING],
                demands=demands,
                shown={t.id: t.queue_reason for t in trials
                       if t.id in wanted or t.id in environments.waiting},
                holdings=holdings,
                capacity=Capacity(slots, self.ctx.pool.slots(s) if demands else ()),
                environments=environments)

    def _may_restart(self, trial_id: int) -> bool:
        """False when the trial's next attempt must not start now: it is being paused or
        preempted (it goes PAUSED instead), or its GPUs still hold the last attempt's
        memory."""
        with self.ctx.store.session_scope() as s:
            trial = s.get_one(Trial, trial_id)
            if trial.state != TrialState.RESTARTING:
                return False
            intent = trial.intent
            if intent in (StopIntent.PAUSE, StopIntent.PREEMPT):
                assert intent is not None
                pause(s, trial, Move(Next.PAUSE, intent.event_reason,
                                     "paused between two attempts"))
                return False
            return intent is StopIntent.KILL or self.ctx.pool.released_for_restart(s, trial)

    def _preempt(self, trial_id: int, for_trial_id: int) -> None:
        """Stop a trial to make room for a waiting one of better priority. It goes back to
        the queue and resumes from its latest checkpoint; not a failure, no restart counted.
        The next pass stops its replicas (SIGTERM, `stop_grace`, so it can checkpoint)."""
        with self.ctx.store.session_scope() as s:
            trial, waiting = s.get_one(Trial, trial_id), s.get_one(Trial, for_trial_id)
            if not TrialState(trial.state).is_active() or trial.intent is not None:
                return
            trial.stop_intent = StopIntent.PREEMPT.value
            record_decision(s, trial, EventReason.PREEMPTED,
                            f"preempted by trial {waiting.id} (priority {waiting.priority}, "
                            f"better than this trial's {trial.priority}); it goes back to the "
                            "queue and resumes from its latest checkpoint")

    def _note_disk(self, shortfall: str | None, tripped: bool) -> None:
        with self.ctx.store.session_scope() as s:
            not_ended = [TrialState.QUEUED, *TrialState.active()]
            for trial in s.scalars(select(Trial).where(Trial.state.in_(values(not_ended)))):
                if trial.state == TrialState.QUEUED:
                    trial.queue_reason = shortfall
                elif shortfall is not None and tripped:
                    record_event(s, entity="trial", entity_id=trial.id,
                                 reason=EventReason.DISK_LOW, actor=ACTOR, message=shortfall,
                                 experiment_id=trial.experiment_id, trial_id=trial.id)


def _each(trials: list[Trial], read: Callable[[Trial], Need],
          broken: list[tuple[int, Exception]]) -> list[Need]:
    """`read` of every trial; one that raises goes to `broken` (with its error) instead."""
    found = []
    for trial in trials:
        try:
            found.append(read(trial))
        except Exception as exc:  # noqa: BLE001 - handed to the isolation, which ends it
            broken.append((trial.id, exc))
    return found


def _holders(s: Session) -> Sequence[Trial]:
    """The trials that hold resources: started, running, or between attempts."""
    return s.scalars(select(Trial).options(selectinload(Trial.experiment))
                     .where(Trial.state.in_(values(TrialState.active())))).all()


def _demand(trial: Trial) -> Demand:
    resources = experiment_config(trial.experiment).resources
    return Demand(trial.id, trial.experiment_id, trial.priority, resources.replicas,
                  resources.gpus_per_replica, resources.gpu_type, resources.max_slots)


def _cluster_demand(trial: Trial) -> Demand:
    resources = experiment_config(trial.experiment).resources
    return Demand(trial.id, trial.experiment_id, trial.priority, resources.replicas,
                  max_slots=resources.max_slots)


def _holding(trial: Trial, gpus: tuple[int, ...], cluster: bool = False) -> Holding:
    """What a running trial holds; on a cluster, a slot per replica (GPUs are Ray's)."""
    resources = experiment_config(trial.experiment).resources
    return Holding(trial.id, trial.experiment_id, trial.priority, resources.replicas, gpus,
                   stopping=trial.intent is not None,
                   gpus_per_replica=0 if cluster else resources.gpus_per_replica)
