"""RayLauncher: each replica under its own detached actor on a Ray node (issue 18).

The same template as `LocalLauncher` (plan, then act; idempotent cancel; logs through
`log()`), over `launch/ray_replica.py`: the actor starts muster's shim on its node with the
spec file, in an attempt directory on a file system the nodes and the server share
(`ray.storage_path`), so every file the supervisor reads — `shim.json`, `exit.json`, the
log and its index — is the local launcher's. What differs is liveness: the shim runs on
another machine, so its pid says nothing here; the replica is alive while its actor is
(found by name in Ray's namespace), and a replica whose actor is gone without an exit
record is LOST. A restarted server describes and cancels replicas it never started: the
actor's name is derived from the spec, and the launch record names it.

Placement: an attempt's replica set is one detached placement group named
`muster:<trial uuid>:<attempt>` with one bundle per replica (`reserve`), so it starts all
or nothing; each replica's actor is pinned to its rank's bundle. The group is removed when
the attempt has ended (`release`), and `sweep` removes groups and actors of attempts that
are no longer live (a crash between two steps). Quarantined nodes are kept out of new
groups by a label selector on Ray's `ray.io/node-id`.

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

from muster.atomic import atomic_write_bytes, atomic_write_json, json_bytes, read_json
from muster.errors import LaunchError
from muster.jobenv import GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE
from muster.launch.base import (
    READY,
    Bundle,
    Launcher,
    LaunchRequest,
    NodeInfo,
    Placement,
    ProcessIdentity,
    ReplicaSpec,
    ReplicaStatus,
)
from muster.launch.local import (
    SHIM,
    LocalLauncher,
    archive_control_files,
    identity_from,
    last_alive,
    log_caught_up,
    modified_at,
    status_of,
)
from muster.launch.ray_replica import (
    ACTOR_PREFIX,
    actor_name,
    group_name,
    replica_actor,
)
from muster.launch.records import spec_to_json
from muster.rundir import RankFiles
from muster.states import ReplicaPhase

__all__ = ["RayLauncher"]

NAMESPACE = "muster"
START_TIMEOUT_S = 120.0  # for an actor to be placed and its shim started
NODE_ID_LABEL = "ray.io/node-id"
SLOTS_TTL_S = 1.0
CREATE_WAIT_S = 0.5  # for a new placement group to be placed, before the pass goes on
Strategy = str  # PACK | SPREAD | STRICT_SPREAD


class RayLauncher(Launcher):
    """Runs each replica under a detached, named actor on a node of a Ray cluster."""

    on_cluster = True

    def __init__(self, address: str = "auto", namespace: str = NAMESPACE,
                 resources: Mapping[str, float] | None = None,
                 strategy: Strategy = "PACK") -> None:
        import ray

        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        self._namespace = namespace
        self._resources = dict(resources or {})  # what each actor asks of its node
        self._strategy = strategy
        self._excluded: set[str] = set()  # quarantined nodes: no new bundle goes there
        self._slots: tuple[float, int] | None = None  # (read at, slots)

    # Placement: one group per attempt.

    def reserve(self, trial_uuid: str, attempt: int, bundles: list[Bundle]) -> Placement:
        """The attempt's placement group, made on the first call (one bundle per replica,
        the configured strategy, quarantined nodes excluded); ready once Ray placed every
        bundle, else waiting with Ray's scheduling state and what the cluster has free."""
        from ray.util.placement_group import placement_group

        name = group_name(trial_uuid, attempt)
        group = self._group(name)
        if group is None:
            shapes = [_shape(bundle) for bundle in bundles]
            selector = ([{NODE_ID_LABEL: f"!in({','.join(sorted(self._excluded))})"}]
                        * len(shapes) if self._excluded else None)
            group = placement_group(shapes, strategy=self._strategy, name=name,
                                    lifetime="detached", bundle_label_selector=selector)
            # A group that fits is placed in milliseconds: wait that long, not a pass.
            group.wait(timeout_seconds=CREATE_WAIT_S)
        table = self._ray.util.placement_group_table(group)
        if table.get("state") == "CREATED":
            placed_on = set((table.get("bundles_to_node_id") or {}).values())
            if placed_on & self._excluded:  # placed before its node was quarantined
                self._ray.util.remove_placement_group(group)
                return Placement(False, "its placement was on a node quarantined since; "
                                        "placing it again")
            return READY
        return Placement(False, self._pending_reason(bundles, table))

    def release(self, trial_uuid: str, attempt: int) -> None:
        group = self._group(group_name(trial_uuid, attempt))
        if group is not None:
            self._ray.util.remove_placement_group(group)

    def sweep(self, keep: set[tuple[str, int]]) -> list[str]:
        """Remove muster's placement groups and replica actors whose attempt is not in
        `keep`; returns their names."""
        removed = []
        for info in self._ray.util.placement_group_table().values():
            name = info.get("name") or ""
            key = _attempt_of(name)
            if key is None or key in keep or info.get("state") == "REMOVED":
                continue
            group = self._group(name)
            if group is not None:
                self._ray.util.remove_placement_group(group)
                removed.append(name)
        for name in self._ray.util.list_named_actors():
            key = _attempt_of(name)
            if key is not None and key not in keep:
                self._kill(name)
                removed.append(name)
        return removed

    def exclude_nodes(self, node_ids: set[str]) -> None:
        if node_ids != self._excluded:
            self._slots = None  # the quarantined nodes' CPUs are out now
        self._excluded = set(node_ids)

    def nodes(self) -> list[NodeInfo]:
        """Ray's nodes (the dead ones too, as Ray still lists them), with their totals and,
        for live ones, what is free now."""
        from ray._private import state  # available per node: not in a public API in 2.60

        free: dict[str, dict[str, float]] = state.available_resources_per_node()  # type: ignore[no-untyped-call]
        found = []
        for node in self._ray.nodes():  # type: ignore[no-untyped-call]
            total = node.get("Resources") or {}
            node_id, alive = str(node["NodeID"]), bool(node.get("Alive"))
            left = free.get(node_id) if alive else None
            found.append(NodeInfo(
                id=node_id, address=str(node.get("NodeManagerAddress", "")), alive=alive,
                cpus=float(total.get("CPU", 0)), gpus=float(total.get("GPU", 0)),
                cpus_free=None if left is None else float(left.get("CPU", 0)),
                gpus_free=None if left is None else float(left.get("GPU", 0)),
                hostname=node.get("NodeManagerHostname")))
        return found

    def slots(self) -> int:
        """The CPUs of the live nodes that are not quarantined: one per replica. Read from
        Ray at most once a second (every pass asks)."""
        now = time.monotonic()
        if self._slots is None or now - self._slots[0] > SLOTS_TTL_S:
            self._slots = (now, int(sum(node.cpus for node in self.nodes()
                                        if node.alive and node.id not in self._excluded)))
        return self._slots[1]

    def node_of(self, attempt_dir: Path, rank: int) -> str | None:
        launch = read_json(RankFiles(attempt_dir, rank).launch)
        return str(launch["node_id"]) if isinstance(launch, dict) and "node_id" in launch else None

    def _group(self, name: str) -> Any | None:
        from ray.util.placement_group import get_placement_group

        try:
            return get_placement_group(name)
        except ValueError:
            return None

    def _pending_reason(self, bundles: list[Bundle], table: dict[str, Any]) -> str:
        state = (table.get("stats") or {}).get("scheduling_state") or table.get("state")
        shape = _shape(bundles[0]) if bundles else {}
        alive = [node for node in self.nodes() if node.alive]
        usable = [node for node in alive if node.id not in self._excluded]
        free = ", ".join(f"{node.id[:8]}: {node.cpus_free:g} CPUs, {node.gpus_free:g} GPUs free"
                         for node in usable)
        excluded = (f"; {len(alive) - len(usable)} quarantined node(s) excluded"
                    if len(usable) < len(alive) else "")
        return (f"waiting for Ray to place {len(bundles)} bundle(s) of {shape} "
                f"({self._strategy}): {state}; {len(usable)} usable node(s) "
                f"({free or 'none'}){excluded}")

    def plan(self, spec: ReplicaSpec) -> LaunchRequest:
        """The spec file, and the shim the actor starts with it on its node."""
        files = RankFiles(spec.attempt_dir, spec.rank)
        return LaunchRequest(spec=spec, argv=["python", "-P", "-m", SHIM, str(files.spec)],
                             cwd=spec.attempt_dir,
                             files={files.spec: json_bytes(spec_to_json(spec))})

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
        group = self._group(group_name(spec.trial_uuid, spec.attempt))
        try:
            spec.attempt_dir.mkdir(parents=True, exist_ok=True)
            if files.launch.exists() or files.exit.exists():
                raise LaunchError(f"Rank {spec.rank} was already launched in "
                                  f"{spec.attempt_dir}; start a new attempt in a new "
                                  "directory.", rank=spec.rank)
            spec = dataclasses.replace(spec, env={**spec.env,
                                                  **self._local_ranks(group, spec)})
            atomic_write_bytes(files.spec, json_bytes(spec_to_json(spec)), mode=0o600)
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
        number (in the order of the ranks); none for a replica without torchrun's variables."""
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
                GROUP_RANK: str(nodes.index(node_of[rank]))}

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

    def describe(self, attempt_dir: Path, rank: int) -> ReplicaStatus:
        """The replica's phase from its files; alive while its actor is."""
        files = RankFiles(attempt_dir, rank)
        status = read_json(files.status)
        launch = read_json(files.launch)
        shim = identity_from(status, "shim") or identity_from(launch, "shim")
        child = identity_from(status, "child")
        alive = self._actor_alive(_actor(launch, attempt_dir, rank))
        exit_data = read_json(files.exit)  # after the liveness check, as locally
        if exit_data is not None and not log_caught_up(files, exit_data):
            # Its actor may be gone, but it ended: not LOST, and not ended for muster
            # until the log's last bytes show on the shared storage.
            exit_data, phase = None, ReplicaPhase.RUNNING
        elif not alive:
            phase = ReplicaPhase.LOST
        else:
            phase = ReplicaPhase.RUNNING if status is not None else ReplicaPhase.STARTING
        # A lost replica (its node died, say) died after it was last known alive; Ray's own
        # death times are when its GCS noticed, seconds later (docs/ray.md).
        lost_at = last_alive(files, status, launch) if phase is ReplicaPhase.LOST else None
        return status_of(rank, phase, status, exit_data, shim, child, modified_at(files.stop),
                         lost_at)


    def _deliver_stop(self, attempt_dir: Path, rank: int) -> None:
        """SIGTERM to the shim, by its actor on its node; nothing when the actor is gone
        (its processes went with it)."""
        handle = self._handle(_actor(read_json(RankFiles(attempt_dir, rank).launch),
                                     attempt_dir, rank))
        if handle is not None:
            handle.stop.remote()

    def archive(self, attempt_dir: Path, rank: int, incarnation: int) -> None:
        if self.describe(attempt_dir, rank).phase in (ReplicaPhase.STARTING,
                                                      ReplicaPhase.RUNNING):
            raise LaunchError(f"rank {rank} of {attempt_dir} is still running; only an ended "
                              "replica can be archived")
        archive_control_files(attempt_dir, rank, incarnation)

    # The files are the local launcher's, on a file system the server shares: served alike.
    log = LocalLauncher.log
    logged_ranks = LocalLauncher.logged_ranks

    def _handle(self, name: str) -> Any | None:
        """The live actor called `name`, or None when there is none (it ended or was
        killed: Ray forgets a dead detached actor's name)."""
        try:
            return self._ray.get_actor(name, namespace=self._namespace)
        except ValueError:
            return None

    def _actor_alive(self, name: str) -> bool:
        return self._handle(name) is not None

    def _kill(self, name: str) -> None:
        handle = self._handle(name)
        if handle is not None:
            self._ray.kill(handle, no_restart=True)


@dataclass(frozen=True)
class _Started:
    """An actor created for a replica, not waited for yet."""

    name: str
    actor: Any
    where: Any  # the ObjectRef of its `where()`


def _shape(bundle: Bundle) -> dict[str, float]:
    shape: dict[str, float] = {"CPU": bundle.cpus}
    if bundle.gpus:
        shape["GPU"] = bundle.gpus
    if bundle.memory:
        shape["memory"] = bundle.memory
    return shape


def _attempt_of(name: str) -> tuple[str, int] | None:
    """(trial uuid, attempt) of one of muster's group or actor names, else None."""
    parts = name.split(":")
    if len(parts) not in (3, 4) or parts[0] != ACTOR_PREFIX or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def _actor(launch: Any, attempt_dir: Path, rank: int) -> str:
    """The replica's actor name: as the launch record says, else derived from its spec (a
    launch cut short before its record)."""
    if isinstance(launch, dict) and isinstance(launch.get("actor"), str):
        return str(launch["actor"])
    spec = read_json(RankFiles(attempt_dir, rank).spec) or {}
    attempt = spec.get("attempt")
    return actor_name(str(spec.get("trial_uuid")), int(attempt) if isinstance(attempt, int)
                      else -1, rank)
