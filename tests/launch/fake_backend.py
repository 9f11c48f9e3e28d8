"""A third backend, for tests only: replicas on N fake "nodes" of this machine.

It shows that a backend is a launcher and a placement registered by name, and nothing in
`supervise/` or `server/` (the contract tests in `tests/supervise/test_supervisor.py` run
a trial through it as through the local backend). What differs from the local backend,
on purpose:

- `FakeLauncher` starts each shim as a plain subprocess (no fork server, no SIGUSR1 to the
  server), on the node its attempt's reservation put its rank on, and records that node
  in its launch record; a replica whose node was taken away (`FakeCluster.take_away`) is
  LOST, as one on a dead Ray node is;
- `FakePlacement` reserves every attempt's replica set all or nothing on the nodes' CPUs
  (one per replica), keeps quarantined nodes out, sweeps what no live attempt holds, and
  has no GPUs to hand out: it places them (there are none), so the plan counts one slot
  per replica.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from muster.atomic import atomic_write_json, read_json
from muster.config import GpuReleaseConfig
from muster.errors import LaunchError
from muster.launch.base import (
    Launcher,
    LaunchRequest,
    ProcessIdentity,
    ReplicaSpec,
    ReplicaStatus,
)
from muster.launch.identity import is_alive, read_identity, send_signal
from muster.launch.shim_launcher import (
    ShimFiles,
    ShimLauncher,
    archive_control_files,
    spawn_shim,
)
from muster.rundir import RankFiles
from muster.schedule.backends import PlacementSetting, register_placement
from muster.schedule.gpu_pool import GpuPool
from muster.schedule.inventory import NoGpus
from muster.schedule.placement import READY, Bundle, NodeInfo, Placement, Reservation
from muster.states import ReplicaPhase
from muster.store import Store

BACKEND = "fake"
NODE_KEY = "node_id"  # where the launch record names the replica's node


@dataclass
class FakeNode:
    cpus: int
    alive: bool = True


@dataclass
class FakeCluster:
    """The nodes, and which node each reserved replica goes to: what the launcher and the
    placement share (Ray's GCS, for Ray's pair)."""

    nodes: dict[str, FakeNode]
    # (trial uuid, attempt) -> the node of each rank, in rank order
    reserved: dict[tuple[str, int], list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, count: int = 2, cpus: int = 2) -> FakeCluster:
        return cls({f"fake-node-{i}": FakeNode(cpus) for i in range(count)})

    def resize(self, slots: int) -> None:
        """Share `slots` CPUs among the nodes, the first ones first."""
        count = len(self.nodes)
        for i, node in enumerate(self.nodes.values()):
            node.cpus = slots // count + (1 if i < slots % count else 0)

    def take_away(self, node_id: str) -> None:
        self.nodes[node_id].alive = False

    def free_cpus(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for placed in self.reserved.values():
            for node_id in placed:
                used[node_id] = used.get(node_id, 0) + 1
        return {node_id: node.cpus - used.get(node_id, 0)
                for node_id, node in self.nodes.items() if node.alive}


class FakeLauncher(ShimLauncher):
    """Starts each replica's shim as a plain subprocess, "on" its reserved node."""

    backend = BACKEND
    python = sys.executable

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self._procs: dict[tuple[Path, int], subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def _act(self, request: LaunchRequest) -> ProcessIdentity:
        spec = request.spec
        files = RankFiles(spec.attempt_dir, spec.rank)
        node = self._node_of(spec)
        try:
            self._prepare(spec, request.files)
            proc = spawn_shim(request.argv, request.cwd, request.env, files.shim_log)
        except OSError as exc:
            raise LaunchError(f"Could not launch rank {spec.rank} on {node}: {exc}",
                              rank=spec.rank) from exc
        with self._lock:
            self._procs[(spec.attempt_dir, spec.rank)] = proc
        identity = read_identity(proc.pid)
        if identity is None:
            raise LaunchError(f"The shim of rank {spec.rank} vanished at once", rank=spec.rank)
        atomic_write_json(files.launch, {"shim_pid": identity.pid,
                                         "shim_start_ticks": identity.start_ticks,
                                         "launched_at": time.time(), NODE_KEY: node})
        return identity

    def _node_of(self, spec: ReplicaSpec) -> str:
        """The node its attempt's reservation put the rank on; the first without one."""
        placed = self.cluster.reserved.get((spec.trial_uuid, spec.attempt))
        return placed[spec.rank] if placed else next(iter(self.cluster.nodes))

    def describe(self, attempt_dir: Path, rank: int) -> ReplicaStatus:
        with self._lock:  # reap the shims that ended: none stays a zombie
            for key in [k for k, proc in self._procs.items() if proc.poll() is not None]:
                del self._procs[key]
        return super().describe(attempt_dir, rank)

    def _alive(self, files: ShimFiles) -> bool:
        node = files.launch.get(NODE_KEY) if isinstance(files.launch, dict) else None
        if node is not None and not self.cluster.nodes[node].alive:
            return False  # its node is gone, and everything on it
        return any(p is not None and is_alive(p) for p in (files.shim, files.child))

    def _live_phase(self, files: ShimFiles, alive: bool) -> ReplicaPhase:
        if not alive:
            return ReplicaPhase.LOST
        return ReplicaPhase.RUNNING if files.status is not None else ReplicaPhase.STARTING

    def _deliver_stop(self, attempt_dir: Path, rank: int) -> None:
        files = ShimFiles(attempt_dir, rank)
        shim, child = files.shim, files.child
        if shim is not None and send_signal(shim, signal.SIGTERM):
            return
        if child is not None:  # no shim to run a grace period
            send_signal(child, signal.SIGKILL)

    def archive(self, attempt_dir: Path, rank: int, incarnation: int) -> None:
        if self.describe(attempt_dir, rank).phase in (ReplicaPhase.STARTING,
                                                      ReplicaPhase.RUNNING):
            raise LaunchError(f"rank {rank} of {attempt_dir} is still running")
        archive_control_files(attempt_dir, rank, incarnation)


class FakePlacement(Placement):
    """All or nothing on the fake nodes' CPUs, one per replica."""

    reserves = True
    places_gpus = True
    quarantines_nodes = True

    def __init__(self, store: Store, cluster: FakeCluster) -> None:
        super().__init__(GpuPool(store, NoGpus("no GPUs: the fake nodes have none"),
                                 GpuReleaseConfig()))
        self.cluster = cluster
        self._excluded: set[str] = set()

    def slots(self) -> int:
        return sum(node.cpus for node_id, node in self.cluster.nodes.items()
                   if node.alive and node_id not in self._excluded)

    def reserve(self, trial_uuid: str, attempt: int, bundles: list[Bundle]) -> Reservation:
        if (trial_uuid, attempt) in self.cluster.reserved:
            return READY
        free = {n: cpus for n, cpus in self.cluster.free_cpus().items()
                if n not in self._excluded}
        placed, there = [], sum(free.values())
        for _ in bundles:
            node = next((n for n, cpus in free.items() if cpus > 0), None)
            if node is None:
                return Reservation(False, f"waiting for {len(bundles)} free CPU(s) on the "
                                          f"fake nodes ({there} free)")
            free[node] -= 1
            placed.append(node)
        self.cluster.reserved[(trial_uuid, attempt)] = placed
        return READY

    def release(self, trial_uuid: str, attempt: int) -> None:
        self.cluster.reserved.pop((trial_uuid, attempt), None)

    def sweep(self, keep: set[tuple[str, int]]) -> list[str]:
        gone = [key for key in self.cluster.reserved if key not in keep]
        for key in gone:
            del self.cluster.reserved[key]
        return [f"{uuid}:{attempt}" for uuid, attempt in gone]

    def exclude_nodes(self, node_ids: set[str]) -> None:
        self._excluded = set(node_ids)

    def nodes(self) -> list[NodeInfo]:
        free = self.cluster.free_cpus()
        return [NodeInfo(id=node_id, address="127.0.0.1", alive=node.alive,
                         cpus=float(node.cpus), gpus=0.0,
                         cpus_free=float(free[node_id]) if node.alive else None,
                         gpus_free=0.0 if node.alive else None, hostname=node_id)
                for node_id, node in self.cluster.nodes.items()]

    def node_of(self, attempt_dir: Path, rank: int) -> str | None:
        launch = read_json(RankFiles(attempt_dir, rank).launch)
        return str(launch[NODE_KEY]) if isinstance(launch, dict) and NODE_KEY in launch else None


def _open_fake_placement(launcher: Launcher, setting: PlacementSetting) -> Placement:
    assert isinstance(launcher, FakeLauncher), launcher
    return FakePlacement(setting.store, launcher.cluster)


register_placement(BACKEND, _open_fake_placement)  # what wiring a backend takes
