"""RayLauncher: each replica under its own detached actor on a Ray node (issue 18).

The same base as `LocalLauncher` (`launch/shim_launcher.py`: plan, then act; idempotent
cancel; the shim's files read one way), over `launch/ray_replica.py`: the actor starts
muster's shim on its node with the spec file, in an attempt directory on a file system the
nodes and the server share (`ray.storage_path`), so every file the supervisor reads —
`shim.json`, `exit.json`, the log and its index — is the local launcher's, and read by the
same code. What differs is liveness: the shim runs on
another machine, so its pid says nothing here; the replica is alive while its actor is
(found by name in Ray's namespace), and a replica whose actor is gone without an exit
record is LOST. A restarted server describes and cancels replicas it never started: the
actor's name is derived from the spec, and the launch record names it.

Placement: an attempt's replica set is one detached placement group (reserved by
`muster.schedule.ray_placement.RayPlacement`, made once at wiring alongside this launcher);
each replica's actor is pinned to its rank's bundle of its attempt's group.

Rendezvous: rank 0's actor picks its node's IP and a free port there before it starts its
shim, and keeps them in the attempt's `master.json`; every rank's actor puts them in its
spec as `MASTER_ADDR` and `MASTER_PORT` before its shim starts (the server's own choice,
127.0.0.1 and a port free here, means nothing on another node), so a replica set's actors
are created side by side (`submit_all`). LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK
follow where the group put each rank, as torchrun's do on each node. A trial that is not
distributed (`resources.distributed_env`) has none of these and no rendezvous.

Ray is imported when the launcher is made, never by `import muster`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muster.atomic import atomic_write_json, json_bytes, read_json
from muster.errors import LaunchError
from muster.jobenv import GROUP_RANK, GROUP_WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
from muster.launch.base import LaunchRequest, ProcessIdentity, ReplicaSpec
from muster.launch.ray_replica import (
    actor_name,
    group_name,
    kill_actor,
    named_actor,
    named_group,
    replica_actor,
)
from muster.launch.records import spec_to_json
from muster.launch.shim_launcher import ShimFiles, ShimLauncher, archive_control_files
from muster.rundir import RankFiles
from muster.states import ReplicaPhase

__all__ = ["RayLauncher"]

NAMESPACE = "muster"
START_TIMEOUT_S = 120.0  # for an actor to be placed and its shim started


class RayLauncher(ShimLauncher):
    """Runs each replica under a detached, named actor on a node of a Ray cluster."""

    backend = "ray"
    python = "python"  # the node's: the actor starts the shim on its own interpreter

    def __init__(self, address: str = "auto", namespace: str = NAMESPACE,
                 resources: Mapping[str, float] | None = None) -> None:
        import ray

        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        self.namespace = namespace  # where the replicas' actors are named
        self._resources = dict(resources or {})  # what each actor asks of its node

    def _act(self, request: LaunchRequest) -> ProcessIdentity:
        """Write the spec, start the replica's actor in its rank's bundle, wait for its
        shim, record the launch (the actor's name, its node, the shim's identity there)."""
        return self._finish(request.spec, self._start(request.spec))

    def submit_all(self, specs: list[ReplicaSpec]) -> dict[int, ProcessIdentity]:
        """Start every rank's actor first, then wait for each: a replica set starts in
        about the time of one actor (a new worker process on its node), not of N."""
        started: list[tuple[ReplicaSpec, _Started]] = []
        try:
            for spec in specs:
                started.append((spec, self._start(spec)))
            return {spec.rank: self._finish(spec, begun) for spec, begun in started}
        except LaunchError as exc:
            for _, begun in started:
                self._kill(begun.name)
            failed = exc.rank if exc.rank is not None else specs[len(started)].rank
            raise LaunchError(str(exc), rank=failed) from exc

    def _start(self, spec: ReplicaSpec) -> _Started:
        """Write the spec (with its per-node ranks) and create the replica's actor, pinned
        to its rank's bundle; does not wait for it."""
        files = RankFiles(spec.attempt_dir, spec.rank)
        where = f"rank {spec.rank} of trial {spec.trial_uuid} attempt {spec.attempt}"
        name = actor_name(spec.trial_uuid, spec.attempt, spec.rank)
        group = named_group(group_name(spec.trial_uuid, spec.attempt))
        spec = dataclasses.replace(spec, env={**spec.env, **self._local_ranks(group, spec)})
        try:
            self._prepare(spec, {files.spec: json_bytes(spec_to_json(spec))})
        except OSError as exc:
            raise LaunchError(f"Could not launch {where} in {spec.attempt_dir}: {exc}",
                              rank=spec.rank) from exc
        self._wait_for_name(name, where)  # a restart in place: the last owner's name
        options: dict[str, Any] = {"name": name, "lifetime": "detached", "max_restarts": 0}
        if group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=spec.rank)
            gpus = group.bundle_specs[spec.rank].get("GPU", 0)
            if gpus:  # Ray then sets CUDA_VISIBLE_DEVICES to the bundle's GPUs
                options["num_gpus"] = gpus
        elif self._resources:
            options["resources"] = self._resources
        # With a group, a distributed trial's actors meet at rank 0's node
        # (`ray_replica.rendezvous`); the others need no rendezvous.
        actor = replica_actor().options(**options).remote(
            str(files.spec), meet=group is not None and spec.distributed)
        return _Started(name, actor, actor.where.remote())

    def _finish(self, spec: ReplicaSpec, begun: _Started) -> ProcessIdentity:
        """Wait for the actor's shim, then record the launch."""
        files = RankFiles(spec.attempt_dir, spec.rank)
        where = f"rank {spec.rank} of trial {spec.trial_uuid} attempt {spec.attempt}"
        try:
            node = self._ray.get(begun.where, timeout=START_TIMEOUT_S)
        except self._ray.exceptions.RayError as exc:  # died, failed __init__, timed out
            self._kill(begun.name)
            raise LaunchError(f"Could not start {where} on Ray: {type(exc).__name__}: "
                              f"{exc}", rank=spec.rank) from exc
        begun.actor.wait_and_exit.remote()  # the actor ends itself once its shim has ended
        shim = node.get("shim")
        if not shim:
            self._kill(begun.name)
            raise LaunchError(f"The shim for {where} vanished right after it was started.",
                              rank=spec.rank)
        identity = ProcessIdentity(int(shim[0]), int(shim[1]))
        try:
            atomic_write_json(files.launch, {
                "shim_pid": identity.pid, "shim_start_ticks": identity.start_ticks,
                "launched_at": time.time(), "actor": begun.name, "node_id": node["node_id"],
                "node_ip": node["ip"], "hostname": node["hostname"]})
        except OSError as exc:
            self._kill(begun.name)  # it must not run untracked
            raise LaunchError(f"Could not record the launch of {where}: {exc}",
                              rank=spec.rank) from exc
        return identity

    def _local_ranks(self, group: Any | None, spec: ReplicaSpec) -> dict[str, str]:
        """torchrun's per-node variables from where the group placed each rank: LOCAL_RANK
        and LOCAL_WORLD_SIZE among the ranks on this rank's node, GROUP_RANK the node's
        number (in the order of the ranks) and GROUP_WORLD_SIZE the number of nodes; none
        for a replica without torchrun's variables."""
        if group is None or not spec.distributed:
            return {}
        rank = spec.rank
        placed = self._ray.util.placement_group_table(group).get("bundles_to_node_id") or {}
        node_of = {int(index): node for index, node in placed.items()}
        if rank not in node_of:
            return {}
        nodes = list(dict.fromkeys(node_of[index] for index in sorted(node_of)))
        mine = sorted(index for index, node in node_of.items() if node == node_of[rank])
        return {LOCAL_RANK: str(mine.index(rank)), LOCAL_WORLD_SIZE: str(len(mine)),
                GROUP_RANK: str(nodes.index(node_of[rank])), GROUP_WORLD_SIZE: str(len(nodes))}

    def _wait_for_name(self, name: str, where: str) -> None:
        """Wait for an actor of the same name (the ended incarnation of a replica restarted
        in place, ending itself) to be gone; kill it if its shim has ended and it lingers."""
        deadline = time.monotonic() + 10
        while (handle := self._handle(name)) is not None:
            if time.monotonic() > deadline:
                try:
                    ended = self._ray.get(handle.poll.remote(), timeout=10) is not None
                except self._ray.exceptions.RayError:
                    ended = True
                if not ended:
                    raise LaunchError(f"Could not launch {where}: its actor {name} still "
                                      "runs a shim")
                self._ray.kill(handle, no_restart=True)
                deadline = time.monotonic() + 10
            time.sleep(0.1)

    def _alive(self, files: ShimFiles) -> bool:
        """Whether the replica's actor lives (found by its name in Ray's namespace)."""
        return self._handle(_actor(files)) is not None

    def _live_phase(self, files: ShimFiles, alive: bool) -> ReplicaPhase:
        # A lost replica (its node died, say) died after it was last known alive; Ray's own
        # death times are when its GCS noticed, seconds later (docs/ray.md).
        if not alive:
            return ReplicaPhase.LOST
        return ReplicaPhase.RUNNING if files.status is not None else ReplicaPhase.STARTING

    def _deliver_stop(self, attempt_dir: Path, rank: int) -> None:
        """SIGTERM to the shim, by its actor on its node; nothing when the actor is gone
        (its processes went with it)."""
        handle = self._handle(_actor(ShimFiles(attempt_dir, rank)))
        if handle is not None:
            handle.stop.remote()

    def archive(self, attempt_dir: Path, rank: int, incarnation: int) -> None:
        if self.describe(attempt_dir, rank).phase in (ReplicaPhase.STARTING,
                                                      ReplicaPhase.RUNNING):
            raise LaunchError(f"rank {rank} of {attempt_dir} is still running; only an ended "
                              "replica can be archived")
        archive_control_files(attempt_dir, rank, incarnation)

    def _handle(self, name: str) -> Any | None:
        """The live actor called `name`, or None when there is none."""
        return named_actor(name, self.namespace)

    def _kill(self, name: str) -> None:
        kill_actor(name, self.namespace)


@dataclass(frozen=True)
class _Started:
    """An actor created for a replica, not waited for yet."""

    name: str
    actor: Any
    where: Any  # the ObjectRef of its `where()`


def _actor(files: ShimFiles) -> str:
    """The replica's actor name: as the launch record says, else derived from its spec (a
    launch cut short before its record)."""
    launch = files.launch
    if isinstance(launch, dict) and isinstance(launch.get("actor"), str):
        return str(launch["actor"])
    spec = read_json(files.paths.spec) or {}
    attempt = spec.get("attempt")
    return actor_name(str(spec.get("trial_uuid")), int(attempt) if isinstance(attempt, int)
                      else -1, files.paths.rank)
