"""The Placement interface: where an attempt's replicas may go, and how many may run at once.

A strategy chosen once, when the server is wired (`muster.schedule.backends.open_placement`),
by the launcher's backend: `LocalPlacement` (this machine's slots and GPU pool, the pure
plan decides) or `RayPlacement` (a placement group per attempt on a Ray cluster's nodes).
The supervisor asks the placement; it never asks which backend runs.

Contract: `slots` may be called on every pass (a cluster's answer is cached by the
implementation); `reserve` is idempotent (asking again reports how the same reservation
stands) and all or nothing; `release` and `sweep` are idempotent; nothing here touches a
trial's state: the supervisor owns every state change (`muster.supervise.placement`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from muster.schedule.gpu_pool import GpuPool
from muster.schedule.inventory import GpuInventory

__all__ = ["READY", "Bundle", "NodeInfo", "Placement", "Reservation"]


@dataclass(frozen=True)
class Bundle:
    """What one replica asks of the node it is placed on (a Ray placement group's bundle)."""

    cpus: float = 1.0
    gpus: int = 0
    memory: int | None = None  # bytes; None: not reserved


@dataclass(frozen=True)
class Reservation:
    """Whether an attempt's replica set has its place: `ready`, or waiting `reason`."""

    ready: bool
    reason: str | None = None


READY = Reservation(True)


@dataclass(frozen=True)
class NodeInfo:
    """One machine replicas run on, as `cluster status` shows it."""

    id: str
    address: str
    alive: bool
    cpus: float
    gpus: float
    cpus_free: float | None = None
    gpus_free: float | None = None
    hostname: str | None = None


class Placement(abc.ABC):
    """Where replicas go: the slots, the GPUs muster hands out, an attempt's reservation,
    the nodes and their quarantine."""

    # What the supervisor must know of a strategy, each a yes or no it asks by name:
    # An attempt waits for `reserve` before it starts, and the wait writes its trial's queue
    # reason: admission then neither admits a trial at its submission nor takes a quiet
    # pass for an unchanged one (the plan alone does not say who starts).
    reserves: ClassVar[bool] = False
    # The backend puts replicas on GPUs itself (a bundle asks for them): muster's GPU pool
    # is empty, and the plan counts one slot for each replica, GPUs or not.
    places_gpus: ClassVar[bool] = False
    # The capacity may grow (an autoscaler): a trial larger than the slots there are now is
    # started, to wait for its reservation, rather than refused or held in the queue.
    may_grow: ClassVar[bool] = False
    # Replicas run on several nodes: the bad-node circuit breaker quarantines one where
    # replicas of several trials in a row ended by an infra failure.
    quarantines_nodes: ClassVar[bool] = False

    def __init__(self, pool: GpuPool) -> None:
        self.pool = pool  # the GPUs muster hands out itself (none where `places_gpus`)

    @property
    def inventory(self) -> GpuInventory:
        return self.pool.inventory

    @abc.abstractmethod
    def slots(self) -> int:
        """Replicas without GPUs (every replica, where `places_gpus`) that may run at once."""

    @abc.abstractmethod
    def reserve(self, trial_uuid: str, attempt: int, bundles: list[Bundle]) -> Reservation:
        """Reserve one bundle per replica for attempt `attempt` of the trial, all or
        nothing; idempotent (asking again reports how the same reservation stands)."""

    @abc.abstractmethod
    def release(self, trial_uuid: str, attempt: int) -> None:
        """Give back the attempt's reservation (its replicas have ended). Idempotent."""

    @abc.abstractmethod
    def sweep(self, keep: set[tuple[str, int]]) -> list[str]:
        """Remove what is held for attempts not in `keep` (trial uuid, attempt number):
        what a crash between two steps left. Returns what it removed."""

    @abc.abstractmethod
    def exclude_nodes(self, node_ids: set[str]) -> None:
        """Place no new replica on these nodes (quarantined)."""

    @abc.abstractmethod
    def nodes(self) -> list[NodeInfo] | None:
        """The nodes replicas run on; None: this machine alone (the caller describes it)."""

    @abc.abstractmethod
    def node_of(self, attempt_dir: Path, rank: int) -> str | None:
        """The node a launched replica runs on (None: not known yet)."""

    def close(self) -> None:
        """Let go of what the placement holds open (the GPU inventory's driver)."""
        self.inventory.close()
