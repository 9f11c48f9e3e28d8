"""What this muster installation has and uses: slots, GPUs, the queue, trials and disk.

`read_cluster` gathers one `ClusterSnapshot` (the database, the GPU inventory, the file
systems); `cluster_status` (`GET /cluster`) and `muster.server.prometheus` (`GET /metrics`)
only present it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sqlalchemy import func, select

from muster import api
from muster.config.quotas import QuotasConfig
from muster.environments.registry import Environments
from muster.environments.runtime_base import BaseSummary
from muster.environments.runtime_plan import TRAINING_PACKAGES
from muster.errors import Conflict, GpuError, NotFound
from muster.home import Home
from muster.schedule.disk import disk_shortfall, free_bytes
from muster.schedule.inventory import Gpu, GpuInventory
from muster.schedule.placement import NodeInfo, Placement
from muster.services.quotas import list_quotas
from muster.services.resources import ReplicaSample, running_replicas
from muster.services.submission import ClusterCapacity
from muster.sizes import format_size
from muster.states import AttemptState, EnvironmentState, GpuState, TrialState, values
from muster.store import Attempt, ClusterNode, GpuDevice, Replica, Store, Trial
from muster.supervise.launching import MASTER_ADDR
from muster.supervise.placement import release_node

log = logging.getLogger(__name__)


class ClusterView(Protocol):
    """What the cluster's status reads of the server (`muster.server.platform.Platform`)."""

    @property
    def store(self) -> Store: ...

    @property
    def home(self) -> Home: ...

    @property
    def placement(self) -> Placement:
        """The slots, the GPU inventory, the nodes."""

    @property
    def envs(self) -> Environments:
        """The built environments, and the runtime base."""

    @property
    def min_free_disk(self) -> int:
        """The disk guard: nothing launches with less free in the runs directory."""

    def slots_in_use(self) -> int:
        """One slot per replica without GPUs of every trial that holds its resources."""

    @property
    def quotas(self) -> QuotasConfig:
        """The cluster config's quotas (admins' runtime limits are in the store)."""


@dataclass(frozen=True)
class GpuStatus:
    """One GPU of the inventory now: its memory use (read live) and who holds it."""

    index: int
    name: str
    type: str
    memory_total: int
    memory_used: int | None  # None: unreadable, and `memory_error` says why
    memory_error: str | None
    state: GpuState
    trial_id: int | None  # the trial it is allocated to (or still releasing from)

    @property
    def allocated(self) -> bool:
        return self.state == GpuState.ALLOCATED


@dataclass(frozen=True)
class Filesystem:
    """A file system holding some of muster's directories, named by the first of them."""

    paths: tuple[Path, ...]
    free_bytes: int
    total_bytes: int

    @property
    def path(self) -> Path:
        return self.paths[0]


@dataclass(frozen=True)
class ClusterSnapshot:
    slots: int
    slots_used: int
    trial_counts: dict[str, int]  # every trial state, 0 included
    gpus: tuple[GpuStatus, ...]
    gpu_note: str
    gpu_source: str
    filesystems: tuple[Filesystem, ...]
    # The latest resource sample of each replica of a RUNNING trial (the `system/` series).
    replicas: tuple[ReplicaSample, ...] = ()

    @property
    def queue_length(self) -> int:
        return self.trial_counts[TrialState.QUEUED]


def submission_capacity(view: ClusterView) -> ClusterCapacity:
    """What a submitted trial's demand is compared with: every slot and GPU there is. A
    Ray cluster may grow (an autoscaler) and its GPUs are Ray's to place: what it cannot
    place waits, then fails as CAPACITY, instead of being refused here."""
    placement = view.placement
    if placement.may_grow:
        return ClusterCapacity(slots=placement.slots(), gpus={}, can_grow=True)
    try:
        gpus = Counter(gpu.type.lower() for gpu in placement.inventory.gpus())
    except GpuError as exc:
        log.warning("GPU inventory unreadable at submission: %s", exc)
        gpus = Counter()
    return ClusterCapacity(slots=placement.slots(), gpus=dict(gpus))


def read_cluster(view: ClusterView) -> ClusterSnapshot:
    """The installation as it is now; GPU memory is read from the inventory, live."""
    home = view.home
    with view.store.session_scope() as s:
        counts = dict(s.execute(select(Trial.state, func.count()).group_by(Trial.state)).all())
        rows = {row.index: (row.state, row.trial_id) for row in s.scalars(
            select(GpuDevice).where(GpuDevice.present.is_(True)))}
        replicas = tuple(running_replicas(s))
    inventory = view.placement.inventory
    gpus = tuple(_gpu_status(inventory, gpu, *rows.get(gpu.index, (GpuState.FREE, None)))
                 for gpu in inventory.gpus())
    return ClusterSnapshot(
        slots=view.placement.slots(),
        slots_used=view.slots_in_use(),
        trial_counts={state: counts.get(state, 0) for state in TrialState},
        gpus=gpus,
        gpu_note=inventory.note,
        gpu_source=inventory.source,
        filesystems=tuple(filesystems([home.root, home.runs_dir, home.experiments_dir])),
        replicas=replicas,
    )


def _gpu_status(inventory: GpuInventory, gpu: Gpu, state: GpuState, trial_id: int | None
                ) -> GpuStatus:
    used: int | None = None
    error: str | None = None
    try:
        used = inventory.memory_used(gpu.index)
    except GpuError as exc:
        error = str(exc)
    return GpuStatus(gpu.index, gpu.name, gpu.type, gpu.memory_total, used, error, state,
                     trial_id)


def filesystems(paths: Sequence[Path]) -> list[Filesystem]:
    """The file systems holding `paths`, each once (by device), in the order of `paths`."""
    by_device: dict[int, list[Path]] = {}
    for path in paths:
        by_device.setdefault(_nearest_existing(path).stat().st_dev, []).append(path)
    result = []
    for group in by_device.values():
        usage = shutil.disk_usage(_nearest_existing(group[0]))
        result.append(Filesystem(tuple(group), usage.free, usage.total))
    return result


def _nearest_existing(path: Path) -> Path:
    """`path`, or its closest ancestor that exists (a directory not made yet)."""
    while not path.exists():
        path = path.parent
    return path


def cluster_status(view: ClusterView) -> api.ClusterStatus:
    """Slots (one per replica without GPUs), GPUs, the queue, trials by state, and free
    disk per file system and against `min_free_disk`."""
    snapshot = read_cluster(view)
    runs_dir = view.home.runs_dir
    free = free_bytes(runs_dir)
    shortfall = disk_shortfall(runs_dir, view.min_free_disk)
    return {
        "slots": snapshot.slots,
        "slots_in_use": snapshot.slots_used,
        "queued": snapshot.queue_length,
        "queue_length": snapshot.queue_length,
        "suspect": snapshot.trial_counts[TrialState.SUSPECT],
        "trial_counts": snapshot.trial_counts,
        "gpus": [_gpu_view(gpu) for gpu in snapshot.gpus],
        "gpu_note": snapshot.gpu_note,
        "gpu_source": snapshot.gpu_source,
        "filesystems": [_filesystem_view(fs) for fs in snapshot.filesystems],
        "runs_dir": str(runs_dir),
        "free_disk_bytes": free,
        "min_free_disk_bytes": view.min_free_disk,
        "disk_ok": shortfall is None,
        "disk_message": shortfall or (f"{format_size(free)} free, at least "
                                      f"{format_size(view.min_free_disk)} required"),
        "environments": _environments_disk(view),
        "runtime_base": runtime_base_view(view.envs.runtime.summary()),
        "nodes": _nodes(view, snapshot),
        "quotas": list_quotas(view.store, view.quotas),
    }


def _nodes(view: ClusterView, snapshot: ClusterSnapshot) -> list[api.NodeView]:
    """The machines trials run on, `{id, address, alive, cpus, gpus, ...}`: a cluster's
    nodes as its launcher lists them (with the circuit breaker's verdict), or, with the
    local launcher, this one (its host name, and the address its ranks meet at); each with
    the replicas of live attempts that run there."""
    with view.store.session_scope() as s:
        quarantined = {node.id: node.quarantine_reason for node in s.scalars(
            select(ClusterNode).where(ClusterNode.quarantined_at.is_not(None)))}
        running: dict[str, list[api.NodeReplicaView]] = {}
        for node_id, trial_id, attempt, rank in s.execute(
                select(Replica.node, Attempt.trial_id, Attempt.number, Replica.rank)
                .join(Replica.attempt)
                .where(Attempt.state.in_(values(AttemptState.live())),
                       Replica.ended_at.is_(None), Replica.node.is_not(None))
                .order_by(Attempt.trial_id, Replica.rank)):
            running.setdefault(str(node_id), []).append(
                {"trial_id": trial_id, "attempt": attempt, "rank": rank})
    found = view.placement.nodes()
    if found is None:
        here = socket.gethostname()
        found = [NodeInfo(id=here, address=MASTER_ADDR, alive=True,
                          cpus=float(os.cpu_count() or 0), gpus=float(len(snapshot.gpus)),
                          cpus_free=None,  # the slots say it: `slots` - `slots_in_use`
                          gpus_free=float(sum(not gpu.allocated for gpu in snapshot.gpus)),
                          hostname=here)]
    return [{"id": node.id, "address": node.address, "alive": node.alive,
             "cpus": int(node.cpus), "gpus": int(node.gpus), "cpus_free": node.cpus_free,
             "gpus_free": node.gpus_free, "hostname": node.hostname,
             "quarantined": node.id in quarantined,
             "quarantine_reason": quarantined.get(node.id),
             "replicas": running.get(node.id, [])} for node in found]


def release_quarantined(store: Store, node_id: str, who: str) -> api.NodeReleaseView:
    """Return a quarantined node to the pool; 404 for a node muster never recorded, 409 for
    one that is not quarantined."""
    with store.session_scope() as s:
        if s.get(ClusterNode, node_id) is None:
            raise NotFound(f"No node {node_id!r} has a record of failures; `muster cluster "
                           "status` lists the nodes and which are quarantined.")
        if not release_node(s, node_id):
            raise Conflict(f"Node {node_id} is not quarantined; nothing to release.")
    log.warning("node %s released from quarantine by %s", node_id, who)
    return {"id": node_id, "released": True}


_SHOWN_PACKAGES = 3


def runtime_base_view(base: BaseSummary) -> api.RuntimeBaseView:
    """What trials without an environment block import: its packages (training packages
    first, in `TRAINING_PACKAGES`' order) and one line that says it, or why it cannot be
    used."""
    rank = {name: i for i, name in enumerate(TRAINING_PACKAGES)}
    packages = sorted(base.packages, key=lambda p: (rank.get(p[0], len(rank)), p[0]))
    if base.error is not None:
        message = f"{base.source}, cannot be used: {base.error}"
    else:
        shown = [f"{name} {version}" for name, version in packages[:_SHOWN_PACKAGES]]
        if len(packages) > _SHOWN_PACKAGES:
            shown.append(f"+{len(packages) - _SHOWN_PACKAGES}")
        listed = f" ({', '.join(shown)})" if shown else ""
        message = (f"{base.source}, {len(packages)} packages{listed}, python {base.python} "
                   f"({base.path})")
    return {"source": base.source, "path": base.path, "python": base.python,
            "packages": [{"name": name, "version": version} for name, version in packages],
            "error": base.error, "message": message}


def _environments_disk(view: ClusterView) -> api.EnvironmentsDisk:
    built = [s for s in view.envs.summaries() if s.state is EnvironmentState.READY]
    return {"count": len(built), "bytes": sum(s.size_bytes or 0 for s in built)}


def _filesystem_view(fs: Filesystem) -> api.FilesystemView:
    return {"paths": [str(p) for p in fs.paths], "free_bytes": fs.free_bytes,
            "total_bytes": fs.total_bytes}


def _gpu_view(gpu: GpuStatus) -> api.GpuView:
    return {
        "index": gpu.index,
        "name": gpu.name,
        "type": gpu.type,
        "memory_total_bytes": gpu.memory_total,
        "memory_used_bytes": gpu.memory_used,
        "memory_error": gpu.memory_error,
        "state": gpu.state,
        "trial_id": gpu.trial_id,
    }
