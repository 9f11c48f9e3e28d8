"""LocalPlacement: replicas on this machine, in its slots and on its GPUs.

The pure plan (`muster.schedule.plan`) decides who starts, from the slots and the GPU pool
(`muster.schedule.gpu_pool`, over the inventory `muster.schedule.inventory` reads): what it
hands out is the reservation, so there is nothing else to reserve, release or sweep, and
one machine has no other node to quarantine or to place a replica on.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from muster.config import GpuReleaseConfig
from muster.schedule.gpu_pool import GpuPool
from muster.schedule.inventory import GpuInventory, NoGpus
from muster.schedule.placement import READY, Bundle, Placement, Reservation
from muster.store import Store

__all__ = ["LocalPlacement"]


class LocalPlacement(Placement):
    """This machine: `configured_slots` replicas without GPUs at once, and its GPUs."""

    def __init__(self, store: Store, slots: int | None = None,
                 inventory: GpuInventory | None = None,
                 release: GpuReleaseConfig | None = None) -> None:
        super().__init__(GpuPool(store, inventory or NoGpus("no GPUs: none configured"),
                                 release or GpuReleaseConfig()))
        # The cluster config's `slots` (or the server's `--slots`); None: the CPU count.
        self.configured_slots = slots if slots is not None else (os.cpu_count() or 1)

    def slots(self) -> int:
        return self.configured_slots

    def reserve(self, trial_uuid: str, attempt: int, bundles: list[Bundle]) -> Reservation:
        """Ready: the plan handed the attempt its slots and GPUs already."""
        return READY

    def release(self, trial_uuid: str, attempt: int) -> None:
        """Nothing: the slots come back with the trial's state, the GPUs through the pool."""

    def sweep(self, keep: set[tuple[str, int]]) -> list[str]:
        """Nothing is held outside the store here."""
        return []

    def exclude_nodes(self, node_ids: set[str]) -> None:
        """Nothing: there is no other node to place a replica on."""

    def nodes(self) -> None:
        """None: this machine alone, which the caller describes (its slots and GPUs)."""
        return None

    def node_of(self, attempt_dir: Path, rank: int) -> str:
        """This machine's host name."""
        return socket.gethostname()
