"""The GPUs in the store: who holds each one, and when a released one may be handed out.

One `gpus` row per GPU of the inventory (`muster.schedule.inventory`). A row holds at most
one trial's replica, and a GPU is handed out only from the `free` state in the same transaction that
records the attempt, so two trials can never be booked on one GPU, and a server restart
finds every allocation where it left it.

A GPU stays with its trial across the trial's attempts (a restart reuses it). When the trial
no longer holds resources (it ended, was paused or preempted) the GPU becomes `releasing`,
and `free` again only once its used memory is at most `gpu_release.max_used_fraction` of
its total, or, after `gpu_release.timeout`, with a warning event naming the GPU and what it
still had in use. That one rule, applied on every pass, also covers a trial that ended while
the server was down.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.config import GpuReleaseConfig
from muster.errors import GpuError
from muster.schedule.inventory import GpuInventory
from muster.schedule.plan import GpuSlot
from muster.sizes import format_size
from muster.states import EventReason, GpuState
from muster.store import GpuDevice, Store, Trial, record_event
from muster.store.actors import SUPERVISOR
from muster.store.models import now

log = logging.getLogger(__name__)

ACTOR = SUPERVISOR


@dataclass
class GpuPool:
    store: Store
    inventory: GpuInventory
    release: GpuReleaseConfig
    _synced: bool = field(default=False, init=False)
    # No GPU in the inventory and no row left in the table: nothing can ever be allocated,
    # so `reclaim` has nothing to do and the table need not be read (GPUs are added to it
    # only by the sync).
    _idle: bool = field(default=False, init=False)
    # GPUs whose memory the last `reclaim` still waited on: only the clock (the next look at
    # their memory) frees them, so the passes poll often while there are any.
    releasing: int = field(default=0, init=False)

    def sync_inventory(self) -> None:
        """Bring the table in step with the inventory the server opened: new GPUs are added
        free; GPUs no longer present are dropped once nobody holds them."""
        gpus = {gpu.index: gpu for gpu in self.inventory.gpus()}
        with self.store.session_scope() as s:
            rows = {row.index: row for row in s.scalars(select(GpuDevice))}
            for index, gpu in gpus.items():
                row = rows.get(index)
                if row is None:
                    s.add(GpuDevice(index=index, name=gpu.name, type=gpu.type,
                                    memory_total=gpu.memory_total, state=GpuState.FREE,
                                    since=now(),
                                    present=True))
                else:
                    row.name, row.type, row.memory_total = gpu.name, gpu.type, gpu.memory_total
                    row.present = True
            kept = len(gpus)
            for index, row in rows.items():
                if index not in gpus:
                    row.present = False
                    if row.state is GpuState.FREE:
                        s.delete(row)
                    else:
                        kept += 1
        self._synced, self._idle = True, kept == 0

    # -- what the scheduler sees -----------------------------------------------------------

    def slots(self, s: Session) -> tuple[GpuSlot, ...]:
        if self._idle:
            return ()
        return tuple(GpuSlot(row.index, row.type, row.state)
                     for row in s.scalars(select(GpuDevice).where(GpuDevice.present.is_(True))
                                          .order_by(GpuDevice.index)))

    def held(self, s: Session) -> dict[int, tuple[int, ...]]:
        """The GPU indices each trial holds."""
        if self._idle:
            return {}
        held: dict[int, list[int]] = defaultdict(list)
        for row in s.scalars(select(GpuDevice).where(GpuDevice.state == GpuState.ALLOCATED)
                             .order_by(GpuDevice.index)):
            if row.trial_id is not None:
                held[row.trial_id].append(row.index)
        return {trial_id: tuple(indices) for trial_id, indices in held.items()}

    def of_trial(self, s: Session, trial_id: int) -> dict[int, tuple[int, ...]]:
        """Rank -> the GPU indices the trial's replica of that rank holds."""
        if self._idle:
            return {}
        by_rank: dict[int, list[int]] = defaultdict(list)
        for row in s.scalars(select(GpuDevice).where(GpuDevice.trial_id == trial_id,
                                                     GpuDevice.state == GpuState.ALLOCATED)
                             .order_by(GpuDevice.index)):
            by_rank[row.rank or 0].append(row.index)
        return {rank: tuple(indices) for rank, indices in by_rank.items()}

    # -- handing out and taking back -------------------------------------------------------

    def allocate(self, s: Session, trial_id: int, per_rank: tuple[tuple[int, ...], ...]) -> None:
        """Give the trial's ranks these GPUs, in the caller's transaction.

        Raises:
            GpuError: one of them is not free (the plan is stale); nothing is booked.
        """
        wanted = {index: rank for rank, indices in enumerate(per_rank) for index in indices}
        rows = {row.index: row for row in s.scalars(
            select(GpuDevice).where(GpuDevice.index.in_(wanted)).with_for_update())}
        busy = [index for index in wanted if index not in rows
                or rows[index].state is not GpuState.FREE or not rows[index].present]
        if busy:
            raise GpuError(f"GPU {', '.join(map(str, sorted(busy)))} is not free; trial "
                           f"{trial_id} was not started on it")
        for index, rank in wanted.items():
            row = rows[index]
            row.state, row.trial_id, row.rank = GpuState.ALLOCATED, trial_id, rank
            row.since = now()

    def released_for_restart(self, s: Session, trial: Trial) -> bool:
        """Whether the trial's next attempt may start on the GPUs it keeps: once each has at
        most `max_used_fraction` of its memory in use, or `timeout` after the last attempt
        ended (then with a warning event). Until then the trial says what it waits for."""
        rows = list(s.scalars(select(GpuDevice).where(GpuDevice.trial_id == trial.id,
                                                      GpuDevice.state == GpuState.ALLOCATED)
                              .order_by(GpuDevice.index)))
        busy = [(row, used) for row in rows
                if (used := self._used(row)) is None
                or used > self.release.max_used_fraction * row.memory_total]
        if not busy:
            return True
        ended = max((a.ended_at or 0.0 for a in trial.attempts if not a.standby), default=0.0)
        waited = now() - ended
        shown = "; ".join(f"GPU {row.index}: {_in_use(row, used)}" for row, used in busy)
        if waited < self.release.timeout:
            reason = (f"waiting for its GPUs to release the last attempt's memory ({shown})")
            if trial.queue_reason != reason:
                trial.queue_reason = reason
            return False
        message = (f"{shown} {waited:.0f}s after the last attempt ended (gpu_release: at most "
                   f"{self.release.max_used_fraction:g} of its memory within "
                   f"{self.release.timeout:g}s); starting the next attempt anyway")
        record_event(s, entity="trial", entity_id=trial.id, reason=EventReason.GPU_RELEASE_TIMEOUT,
                     actor=ACTOR, message=message, experiment_id=trial.experiment_id,
                     trial_id=trial.id)
        log.warning("trial %s: %s", trial.id, message)
        return True

    def _used(self, row: GpuDevice) -> int | None:
        try:
            return self.inventory.memory_used(row.index)
        except GpuError as exc:
            log.warning("cannot read the memory of GPU %s: %s", row.index, exc)
            return None

    def reclaim(self) -> None:
        """Take back the GPUs of trials that no longer hold resources, and free the ones
        whose memory has been released (or whose timeout has passed). The first call brings
        the table in step with the inventory (once the server's migrations have run)."""
        if not self._synced:
            self.sync_inventory()
        if self._idle:
            return
        with self.store.session_scope() as s:
            self._take_back(s)
            rows = list(s.scalars(select(GpuDevice).where(
                GpuDevice.state == GpuState.RELEASING)))
            self.releasing = sum(not self._maybe_free(s, row) for row in rows)
            if not self.inventory.gpus():
                self._idle = s.scalars(select(GpuDevice.index).limit(1)).first() is None

    def _take_back(self, s: Session) -> None:
        rows = s.scalars(select(GpuDevice).where(GpuDevice.state == GpuState.ALLOCATED))
        for row in rows:
            trial = s.get(Trial, row.trial_id) if row.trial_id is not None else None
            if trial is None or not trial.state.is_active():
                row.state, row.since = GpuState.RELEASING, now()

    def _maybe_free(self, s: Session, row: GpuDevice) -> bool:
        """Free the GPU if its memory was released or its timeout passed; True if freed."""
        waited = now() - row.since
        used = self._used(row)
        limit = self.release.max_used_fraction * row.memory_total
        if used is not None and used <= limit:
            self._free(s, row)
            return True
        if waited < self.release.timeout:
            return False
        shown = _in_use(row, used, still=True)
        trial = f" by trial {row.trial_id}" if row.trial_id is not None else ""
        message = (f"GPU {row.index} ({row.name}): {shown} {waited:.0f}s after it was "
                   f"released{trial} (gpu_release: at most {self.release.max_used_fraction:g} "
                   f"of its memory within {self.release.timeout:g}s); handing it out anyway")
        trial_row = s.get(Trial, row.trial_id) if row.trial_id is not None else None
        record_event(s, entity="gpu", entity_id=row.index, reason=EventReason.GPU_RELEASE_TIMEOUT,
                     actor=ACTOR, message=message,
                     experiment_id=trial_row.experiment_id if trial_row else None,
                     trial_id=row.trial_id)
        log.warning("%s", message)
        self._free(s, row)
        return True

    def _free(self, s: Session, row: GpuDevice) -> None:
        if not row.present:
            s.delete(row)
            return
        row.state, row.trial_id, row.rank, row.since = GpuState.FREE, None, None, now()


def _in_use(row: GpuDevice, used: int | None, still: bool = False) -> str:
    if used is None:
        return "memory use could not be read"
    return (f"{format_size(used)} of {format_size(row.memory_total)}"
            f"{' still' if still else ''} in use")
