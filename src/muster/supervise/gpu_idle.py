"""One warning per trial whose GPU sits idle while its CPU works: "running on CPU?".

A script that was given a GPU and never moved its model there (a forgotten `.to(device)`,
a CUDA build missing from its environment) still trains, slowly, and still passes: nothing
fails, so nobody is told. Its `system/` series show it (`muster.system_metrics`): the
replica's GPU utilisation stays at 0% while its CPU is busy. `idle_gpu` is the decision,
pure, over one rank's samples: the GPU read 0% in every sample of the last `WINDOW_S` (10
minutes) or longer, and the CPU averaged at least `BUSY_CPU_PERCENT` over them. A replica
that waits (for data, for a peer) uses neither, and is not warned about; a GPU that did any
work in the window clears it.

`warn_if_gpu_idle` runs after an ingestion stored samples whose latest, for some rank,
shows its GPUs idle (`ranks_last_seen_idle`: a trial that uses its GPU costs no query). It
reads at most `MAX_SAMPLES` of that rank's latest samples (10 minutes of them down to an
interval of 0.6 s; at a shorter interval the window is not covered and nothing is said),
and records the warning as an event of the trial, once, beside its other warnings.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.states import EventReason, MetricKind
from muster.store import Event, Metric, Store, Trial, record_event
from muster.store.actors import SUPERVISOR
from muster.store.series import MetricRow, finite
from muster.system_metrics import CPU_PERCENT, GPU_UTIL_PERCENT

__all__ = ["BUSY_CPU_PERCENT", "MAX_SAMPLES", "WINDOW_S", "IdleGpu", "Sample", "idle_gpu",
           "idle_gpu_message", "ranks_last_seen_idle", "warn_if_gpu_idle"]

log = logging.getLogger(__name__)

WINDOW_S = 600.0
BUSY_CPU_PERCENT = 50.0  # half a core: the script is working, not waiting
MAX_SAMPLES = 1000


@dataclass(frozen=True)
class Sample:
    """One resource sample of a rank, as far as the decision needs it."""

    time: float
    cpu_percent: float | None
    gpu_util_percent: float | None


@dataclass(frozen=True)
class IdleGpu:
    """A rank's GPUs idle for `seconds` while its CPU averaged `cpu_percent`."""

    seconds: float
    cpu_percent: float


def idle_gpu(samples: Sequence[Sample], window_s: float = WINDOW_S) -> IdleGpu | None:
    """Whether a rank's latest samples (`samples`, oldest first) show its GPUs at 0% for at
    least `window_s` while its CPU was busy; None when they do not (or show no GPU)."""
    idle: list[Sample] = []
    for sample in reversed(samples):
        if sample.gpu_util_percent is None or sample.gpu_util_percent > 0:
            break
        idle.append(sample)
    if not idle:
        return None
    seconds = idle[0].time - idle[-1].time
    cpu = [s.cpu_percent for s in idle if s.cpu_percent is not None]
    if seconds < window_s or not cpu:
        return None
    mean = sum(cpu) / len(cpu)
    return IdleGpu(seconds, mean) if mean >= BUSY_CPU_PERCENT else None


def idle_gpu_message(rank: int, idle: IdleGpu) -> str:
    """The warning's words."""
    return (f"rank {rank} is not using its GPU: running on CPU? Its GPU utilisation stayed "
            f"at 0% for {idle.seconds / 60:.0f} minutes while its CPU was "
            f"{idle.cpu_percent:.0f}% busy (100% is one core); check that the model and its "
            "data are moved to the GPU, and that the environment's torch has CUDA")


def ranks_last_seen_idle(rows: Iterable[MetricRow]) -> set[tuple[int, int]]:
    """(attempt, rank) of each rank whose latest sample among `rows` reads its GPUs at 0%."""
    latest: dict[tuple[int, int], MetricRow] = {}
    for row in rows:
        latest[(row["attempt"], row["rank"])] = row
    return {key for key, row in latest.items() if row["values"].get(GPU_UTIL_PERCENT) == 0}


def warn_if_gpu_idle(store: Store, trial_id: int, ranks: Iterable[tuple[int, int]]) -> bool:
    """Record the trial's warning (an event) when one of `ranks` (attempt, rank) has had its
    GPUs idle while its CPU was busy, unless the trial has it already. Returns whether it
    was recorded."""
    with store.session_scope() as s:
        if _warned(s, trial_id):
            return False
        for attempt, rank in sorted(ranks):
            idle = idle_gpu(_latest_samples(s, trial_id, attempt, rank))
            if idle is None:
                continue
            message = idle_gpu_message(rank, idle)
            log.warning("trial %d: %s", trial_id, message)
            record_event(s, entity="trial", entity_id=trial_id, trial_id=trial_id,
                         experiment_id=s.get_one(Trial, trial_id).experiment_id,
                         reason=EventReason.GPU_IDLE, actor=SUPERVISOR, message=message)
            return True
    return False


def _warned(s: Session, trial_id: int) -> bool:
    return s.scalar(select(Event.id).where(
        Event.trial_id == trial_id, Event.reason == EventReason.GPU_IDLE).limit(1)) is not None


def _latest_samples(s: Session, trial_id: int, attempt: int, rank: int) -> list[Sample]:
    """The rank's latest `MAX_SAMPLES` samples of the attempt, oldest first."""
    rows = s.execute(select(Metric.time, Metric.values).where(
        Metric.trial_id == trial_id, Metric.kind == MetricKind.SYSTEM,
        Metric.attempt == attempt, Metric.rank == rank)
        .order_by(Metric.step.desc()).limit(MAX_SAMPLES)).all()
    return [Sample(at, finite(values.get(CPU_PERCENT)), finite(values.get(GPU_UTIL_PERCENT)))
            for at, values in reversed(rows)]
