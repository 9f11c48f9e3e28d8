"""Who starts next: the queue's order, whole-replica-set admission, and preemption.

`plan` is a pure function over plain data, table-tested without processes; the supervisor
gathers the data from the store and carries the plan out (`Supervisor._admit_queued`).

The rules:

- Order: priority (1-99, lower first, as in Determined), then submission (the trial id):
  first come, first served within a priority.
- A trial starts all of its replicas or none (a partial start would hang a torch.distributed
  rendezvous). A replica without GPUs takes a slot; one with `gpus_per_replica: g` takes g
  free GPUs (of `gpu_type`, when set) for itself alone, and no slot.
- A trial that does not fit waits, and so does every later trial that needs the same kind
  of resource (slots, or GPUs), so that a large trial is not starved by a stream of small
  ones. A trial that could never fit (it needs more than the server has) waits with that
  reason and holds up nobody; so does one held back by its experiment's `max_slots`, or by
  a quota of its owner's (`muster.schedule.quotas`: "alice's quota: 8 of 8 GPUs in use"),
  counted with what the trials admitted before it in the same plan take.
- With preemption on, a trial that waits for resources may stop running trials of worse
  priority (a greater number): the worst first, the newest first within a priority, and
  only as many as it needs, and only when stopping them makes it fit. Trials already being
  stopped, and GPUs still releasing their memory, count as resources on their way back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from muster.schedule.quotas import Charge, QuotaBook, Usage
from muster.states import GpuState
from muster.words import count

__all__ = ["Capacity", "Demand", "GpuSlot", "Holding", "Plan", "plan"]


@dataclass(frozen=True)
class Demand:
    """A queued trial: what it needs to start."""

    trial_id: int
    experiment_id: int
    priority: int
    replicas: int
    gpus_per_replica: int = 0
    gpu_type: str | None = None  # lower case; None: any type
    max_slots: int | None = None  # its experiment's cap on replicas running at once
    charge: Charge | None = None  # what it counts against its owner's quotas; None: nothing

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True)
class Holding:
    """A trial that holds resources now (started, running, or between attempts)."""

    trial_id: int
    experiment_id: int
    priority: int
    replicas: int
    gpus: tuple[int, ...] = ()  # the GPU indices it holds
    stopping: bool = False  # being killed, paused or preempted: its resources come back
    gpus_per_replica: int = 0
    charge: Charge | None = None  # what it counts against its owner's quotas

    @property
    def slots(self) -> int:
        """Slots it takes: one per replica, unless its replicas run on GPUs."""
        return 0 if self.gpus or self.gpus_per_replica else self.replicas


@dataclass(frozen=True)
class GpuSlot:
    index: int
    type: str
    state: GpuState


@dataclass(frozen=True)
class Capacity:
    slots: int
    gpus: tuple[GpuSlot, ...] = ()


@dataclass(frozen=True)
class Admit:
    trial_id: int
    gpus: tuple[tuple[int, ...], ...] = ()  # per rank; empty for a trial without GPUs


@dataclass
class Plan:
    admit: list[Admit] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)  # trial id -> why, with position
    # trial to stop and requeue -> the waiting trial it makes room for
    preempt: dict[int, int] = field(default_factory=dict)


def plan(queue: Sequence[Demand], holdings: Sequence[Holding], capacity: Capacity,
         preemption: bool = False, quotas: QuotaBook | None = None) -> Plan:
    """Decide which queued trials start now, which wait (and why), whom to preempt; no
    trial starts past a quota of its owner's in `quotas`."""
    state = _Pool(capacity, holdings)
    usage = Usage(quotas or QuotaBook(), (h.charge for h in holdings if h.charge is not None))
    result = Plan()
    blocked: dict[str, int] = {}  # kind of resource -> the trial that waits first for it
    position = 0
    for demand in sorted(queue, key=lambda d: (d.priority, d.trial_id)):
        never = _never_fits(demand, capacity) or (
            usage.beyond(demand.charge) if demand.charge is not None else None)
        if never is not None:
            result.waiting[demand.trial_id] = never
            continue
        position += 1
        kind = "gpus" if demand.gpus_per_replica else "slots"
        running = state.replicas_of[demand.experiment_id]
        if demand.max_slots is not None and running + demand.replicas > demand.max_slots:
            result.waiting[demand.trial_id] = (
                f"position {position}: its experiment runs {count(running, 'replica')} and "
                f"resources.max_slots is {demand.max_slots}")
            continue
        held_back = usage.refusal(demand.charge) if demand.charge is not None else None
        if held_back is not None:
            result.waiting[demand.trial_id] = f"position {position}: {held_back}"
            continue
        if kind in blocked:
            result.waiting[demand.trial_id] = (
                f"position {position}: waiting behind trial {blocked[kind]} "
                f"({_need(demand)}; first come, first served within a priority)")
            continue
        gpus = state.take(demand)
        if gpus is not None:
            result.admit.append(Admit(demand.trial_id, gpus))
            if demand.charge is not None:
                usage.add(demand.charge)
            position -= 1  # it no longer waits: positions count the trials still waiting
            continue
        blocked[kind] = demand.trial_id
        reason = f"position {position}: {state.shortfall(demand)}"
        if preemption:
            victims = state.victims(demand)
            if victims:
                result.preempt.update(dict.fromkeys(victims, demand.trial_id))
                names = ", ".join(map(str, victims))
                reason += f"; preempting trial{'s' if len(victims) > 1 else ''} {names}"
        result.waiting[demand.trial_id] = reason
    return result


class _Pool:
    """What is free, as `plan` hands it out in order."""

    def __init__(self, capacity: Capacity, holdings: Sequence[Holding]) -> None:
        self.holdings = list(holdings)
        held_gpus = {index for h in holdings for index in h.gpus}
        self.slots_free = capacity.slots - sum(h.slots for h in holdings)
        self.free_gpus = [g for g in sorted(capacity.gpus, key=lambda g: g.index)
                          if g.state == GpuState.FREE and g.index not in held_gpus]
        self.releasing = [g for g in capacity.gpus if g.state == GpuState.RELEASING]
        self.types = {g.index: g.type for g in capacity.gpus}
        self.replicas_of: Counter[int] = Counter()
        for holding in holdings:
            self.replicas_of[holding.experiment_id] += holding.replicas
        self.chosen: set[int] = set()  # trials already chosen for preemption this pass

    def take(self, demand: Demand) -> tuple[tuple[int, ...], ...] | None:
        """Reserve what `demand` needs (GPUs per rank), or None when it does not fit."""
        if not demand.gpus_per_replica:
            if demand.replicas > self.slots_free:
                return None
            self.slots_free -= demand.replicas
            self.replicas_of[demand.experiment_id] += demand.replicas
            return ()
        matching = [g for g in self.free_gpus if _matches(g.type, demand.gpu_type)]
        if len(matching) < demand.gpus:
            return None
        taken = matching[:demand.gpus]
        self.free_gpus = [g for g in self.free_gpus if g not in taken]
        self.replicas_of[demand.experiment_id] += demand.replicas
        per = demand.gpus_per_replica
        return tuple(tuple(g.index for g in taken[r * per:(r + 1) * per])
                     for r in range(demand.replicas))

    def shortfall(self, demand: Demand) -> str:
        if not demand.gpus_per_replica:
            return f"waiting for {count(demand.replicas, 'slot')}, {max(self.slots_free, 0)} free"
        free = sum(_matches(g.type, demand.gpu_type) for g in self.free_gpus)
        releasing = sum(_matches(g.type, demand.gpu_type) for g in self.releasing)
        text = f"waiting for {_need(demand)}, {free} free"
        return text + (f" ({releasing} more releasing memory)" if releasing else "")

    def victims(self, demand: Demand) -> list[int]:
        """The fewest worse-priority trials whose resources, with those already on their
        way back, make `demand` fit; [] when none need stopping or it would not help."""
        def frees(holding: Holding) -> int:
            if not demand.gpus_per_replica:
                return holding.slots
            return sum(_matches(self.types.get(i, ""), demand.gpu_type) for i in holding.gpus)

        if demand.gpus_per_replica:
            needed = demand.gpus - sum(_matches(g.type, demand.gpu_type)
                                       for g in [*self.free_gpus, *self.releasing])
        else:
            needed = demand.replicas - self.slots_free
        needed -= sum(frees(h) for h in self.holdings
                      if h.stopping or h.trial_id in self.chosen)
        if needed <= 0:
            return []  # enough is on its way back already
        candidates = sorted((h for h in self.holdings
                             if not h.stopping and h.trial_id not in self.chosen
                             and h.priority > demand.priority and frees(h) > 0),
                            key=lambda h: (-h.priority, -h.trial_id))
        chosen: list[int] = []
        for holding in candidates:
            chosen.append(holding.trial_id)
            needed -= frees(holding)
            if needed <= 0:
                self.chosen.update(chosen)
                return chosen
        return []


def _never_fits(demand: Demand, capacity: Capacity) -> str | None:
    if not demand.gpus_per_replica:
        if demand.replicas <= capacity.slots:
            return None
        return (f"needs {count(demand.replicas, 'slot')} for its replicas, but this server "
                f"has {capacity.slots}; raise `slots` in the cluster config (or `muster up "
                "--slots`), or lower resources.replicas")
    have = sum(_matches(g.type, demand.gpu_type) for g in capacity.gpus)
    if demand.gpus <= have:
        return None
    of_type = f" of type {demand.gpu_type}" if demand.gpu_type else ""
    has = f"has {have}{of_type}" if have else f"has no GPUs{of_type}"
    return (f"needs {_need(demand)} ({demand.gpus_per_replica} per replica), but this "
            f"server {has}; lower resources.replicas or gpus_per_replica"
            + (", or drop gpu_type" if demand.gpu_type else ""))


def _matches(gpu_type: str, wanted: str | None) -> bool:
    return wanted is None or gpu_type.lower() == wanted


def _need(demand: Demand) -> str:
    if not demand.gpus_per_replica:
        return count(demand.replicas, "slot")
    of_type = f" of type {demand.gpu_type}" if demand.gpu_type else ""
    return f"{count(demand.gpus, 'GPU')}{of_type}"

