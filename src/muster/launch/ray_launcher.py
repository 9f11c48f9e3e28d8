"""RayLauncher: each replica under its own detached actor on a Ray node (issue 18, in part).

The same template as `LocalLauncher` (plan, then act; idempotent cancel; logs through
`log()`), over `launch/ray_replica.py`: the actor starts muster's shim on its node with the
spec file, in an attempt directory on a file system the nodes and the server share
(`ray.storage_path`), so every file the supervisor reads — `shim.json`, `exit.json`, the
log and its index — is the local launcher's. What differs is liveness: the shim runs on
another machine, so its pid says nothing here; the replica is alive while its actor is
(found by name in Ray's namespace), and a replica whose actor is gone without an exit
record is LOST. A restarted server describes and cancels replicas it never started: the
actor's name is derived from the spec, and the launch record names it.

Not built yet (docs/architecture.md, "On Ray"): placement groups per attempt (here each
actor is placed alone, on a node with the `resources` it asks for), the server's wiring.
Ray is imported when the launcher is made, never by `import muster`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from muster.atomic import atomic_write_bytes, atomic_write_json, json_bytes, read_json
from muster.errors import LaunchError
from muster.launch.base import (
    Launcher,
    LaunchRequest,
    ProcessIdentity,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from muster.launch.local import (
    SHIM,
    LocalLauncher,
    archive_control_files,
    identity_from,
    modified_at,
    status_of,
)
from muster.launch.ray_replica import actor_name, replica_actor
from muster.launch.records import spec_to_json
from muster.rundir import RankFiles

__all__ = ["RayLauncher"]

NAMESPACE = "muster"
START_TIMEOUT_S = 120.0  # for an actor to be placed and its shim started


class RayLauncher(Launcher):
    """Runs each replica under a detached, named actor on a node of a Ray cluster."""

    def __init__(self, address: str = "auto", namespace: str = NAMESPACE,
                 resources: Mapping[str, float] | None = None) -> None:
        import ray

        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        self._namespace = namespace
        self._resources = dict(resources or {})  # what each actor asks of its node

    def plan(self, spec: ReplicaSpec) -> LaunchRequest:
        """The spec file, and the shim the actor starts with it on its node."""
        files = RankFiles(spec.attempt_dir, spec.rank)
        return LaunchRequest(spec=spec, argv=["python", "-P", "-m", SHIM, str(files.spec)],
                             cwd=spec.attempt_dir,
                             files={files.spec: json_bytes(spec_to_json(spec))})

    def _act(self, request: LaunchRequest) -> ProcessIdentity:
        """Write the spec, start the replica's actor, wait for its shim, record the launch
        (the actor's name, its node, the shim's identity there)."""
        spec = request.spec
        files = RankFiles(spec.attempt_dir, spec.rank)
        where = f"rank {spec.rank} of trial {spec.trial_uuid} attempt {spec.attempt}"
        name = actor_name(spec.trial_uuid, spec.attempt, spec.rank)
        try:
            spec.attempt_dir.mkdir(parents=True, exist_ok=True)
            if files.launch.exists() or files.exit.exists():
                raise LaunchError(f"Rank {spec.rank} was already launched in "
                                  f"{spec.attempt_dir}; start a new attempt in a new directory.")
            for path, data in request.files.items():
                atomic_write_bytes(path, data, mode=0o600)  # a spec holds the job's secrets
        except OSError as exc:
            raise LaunchError(f"Could not launch {where} in {spec.attempt_dir}: {exc}") from exc
        actor = replica_actor().options(name=name, lifetime="detached",
                                        resources=self._resources or None,
                                        max_restarts=0).remote(str(files.spec))
        try:
            node = self._ray.get(actor.where.remote(), timeout=START_TIMEOUT_S)
        except self._ray.exceptions.RayError as exc:  # died, failed __init__, timed out
            self._kill(name)
            raise LaunchError(f"Could not start {where} on Ray: {type(exc).__name__}: "
                              f"{exc}") from exc
        actor.wait_and_exit.remote()  # the actor ends itself once its shim has ended
        shim = node.get("shim")
        if not shim:
            self._kill(name)
            raise LaunchError(f"The shim for {where} vanished right after it was started.")
        identity = ProcessIdentity(int(shim[0]), int(shim[1]))
        try:
            atomic_write_json(files.launch, {
                "shim_pid": identity.pid, "shim_start_ticks": identity.start_ticks,
                "launched_at": time.time(), "actor": name, "node_id": node["node_id"],
                "node_ip": node["ip"], "hostname": node["hostname"]})
        except OSError as exc:
            self._kill(name)  # it must not run untracked
            raise LaunchError(f"Could not record the launch of {where}: {exc}") from exc
        return identity

    def describe(self, attempt_dir: Path, rank: int) -> ReplicaStatus:
        """The replica's phase from its files; alive while its actor is."""
        files = RankFiles(attempt_dir, rank)
        status = read_json(files.status)
        launch = read_json(files.launch)
        shim = identity_from(status, "shim") or identity_from(launch, "shim")
        child = identity_from(status, "child")
        alive = self._actor_alive(_actor(launch, attempt_dir, rank))
        exit_data = read_json(files.exit)  # after the liveness check, as locally
        if not alive:
            phase = ReplicaPhase.LOST
        else:
            phase = ReplicaPhase.RUNNING if status is not None else ReplicaPhase.STARTING
        return status_of(rank, phase, status, exit_data, shim, child, modified_at(files.stop))


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


def _actor(launch: Any, attempt_dir: Path, rank: int) -> str:
    """The replica's actor name: as the launch record says, else derived from its spec (a
    launch cut short before its record)."""
    if isinstance(launch, dict) and isinstance(launch.get("actor"), str):
        return str(launch["actor"])
    spec = read_json(RankFiles(attempt_dir, rank).spec) or {}
    attempt = spec.get("attempt")
    return actor_name(str(spec.get("trial_uuid")), int(attempt) if isinstance(attempt, int)
                      else -1, rank)
