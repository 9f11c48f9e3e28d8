"""One replica on a Ray node: a detached, named actor that runs muster's shim there (issue 18).

The actor is the shim's owner on its node, as the local launcher's process is on this one:
it starts `python -P -m muster.launch.shim SPEC` in a session of its own, exactly as
`LocalLauncher` does, so process groups, byte-exact logs, the memory limit and `exit.json`
behave the same; the run directory is on a file system every node and the server mount
(`ray.storage_path`). The actor is detached (it outlives the driver, so the shim outlives a
muster server that is killed) and named `muster:<trial uuid>:<attempt>:<rank>` (a restarted
server finds it again by name). A shim never outlives its actor: Ray kills the worker's
children with it, and on nodes started as docs/ray.md asks —
`RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=true` and
`RAY_process_group_cleanup_enabled=false` — the raylet, a subreaper, also kills the training
process group the shim leaves behind in its own session (Ray 2.60's per-worker process
groups, on by default, left it running under PID 1). An actor that is gone means the
replica is LOST.

Importing this module imports nothing of Ray; `replica_actor()` does, once.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from muster.atomic import atomic_write_bytes, atomic_write_json, json_bytes, read_json
from muster.jobenv import MASTER_ADDR, MASTER_PORT
from muster.launch import ray_calls
from muster.launch.base import ProcessIdentity
from muster.launch.identity import read_identity, send_signal
from muster.launch.shim_launcher import SHIM, spawn_shim
from muster.rundir import RankFiles

__all__ = ["ACTOR_PREFIX", "MASTER_FILE", "actor_name", "attempt_of", "free_endpoint",
           "group_name", "kill_actor", "named_actor", "named_group", "rendezvous",
           "replica_actor"]

ACTOR_PREFIX = "muster"


def actor_name(trial_uuid: str, attempt: int, rank: int) -> str:
    """`muster:<trial uuid>:<attempt>:<rank>`: one name per replica, in muster's namespace."""
    return f"{ACTOR_PREFIX}:{trial_uuid}:{attempt}:{rank}"


def group_name(trial_uuid: str, attempt: int) -> str:
    """`muster:<trial uuid>:<attempt>`: the attempt's placement group."""
    return f"{ACTOR_PREFIX}:{trial_uuid}:{attempt}"


def attempt_of(name: str) -> tuple[str, int] | None:
    """(trial uuid, attempt) of one of muster's group or actor names, else None."""
    parts = name.split(":")
    if len(parts) not in (3, 4) or parts[0] != ACTOR_PREFIX or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def named_group(name: str) -> Any | None:
    """The placement group called `name`; None when there is none (imports Ray)."""
    from ray.util.placement_group import get_placement_group

    try:
        return get_placement_group(name)
    except ValueError:
        return None


def named_actor(name: str, namespace: str) -> Any | None:
    """The live actor called `name`, or None when there is none (it ended or was killed:
    Ray forgets a dead detached actor's name). Imports Ray."""
    import ray

    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def kill_actor(name: str, namespace: str) -> None:
    """Kill the actor called `name`, if it lives (imports Ray)."""
    import ray

    handle = named_actor(name, namespace)
    if handle is not None:
        ray.kill(handle, no_restart=True)


def free_endpoint() -> tuple[str, int]:
    """This node's IP and a TCP port free on it now: rank 0's rendezvous (run as a Ray task
    in rank 0's bundle)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    return ray_calls.node_ip(), port


MASTER_FILE = "master.json"  # rank 0's rendezvous, in the attempt directory
RENDEZVOUS_TIMEOUT_S = 120.0  # for rank 0's actor to publish it


def rendezvous(spec_path: Path, rank: int, timeout: float = RENDEZVOUS_TIMEOUT_S) -> None:
    """Meet at rank 0's node: rank 0 (when the attempt has no `master.json` yet) picks this
    node's IP and a free port and publishes them; every rank waits for them and puts them
    in its spec as MASTER_ADDR and MASTER_PORT, before its shim reads it.

    Raises:
        TimeoutError: rank 0 published nothing in `timeout` seconds (its actor failed).
    """
    master = spec_path.parent / MASTER_FILE
    if rank == 0 and not master.exists():
        ip, port = free_endpoint()
        atomic_write_json(master, {"addr": ip, "port": port})
    deadline = time.monotonic() + timeout
    while (found := read_json(master)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 published no rendezvous in {master} in {timeout:g} s")
        time.sleep(0.02)
    spec = read_json(spec_path)
    if not isinstance(spec, dict):
        raise ValueError(f"{spec_path} is not a replica's spec")
    spec["env"] = {**spec["env"], MASTER_ADDR: str(found["addr"]),
                   MASTER_PORT: str(found["port"])}
    atomic_write_bytes(spec_path, json_bytes(spec), mode=0o600)  # it holds the job's secrets


class Placed(TypedDict):
    """Where a replica's actor runs, as its `where()` answers."""

    node_id: str  # Ray's
    ip: str
    hostname: str
    shim: tuple[int, int] | None  # (pid, start ticks); None: it vanished at once


class ReplicaOwner:
    """What the actor does on its node (plain Python; `replica_actor` makes it an actor)."""

    def __init__(self, spec_path: str, meet: bool = False) -> None:
        files = RankFiles(Path(spec_path).parent, _rank_of(spec_path))
        if meet:  # the ranks of a placement group meet at rank 0's node
            rendezvous(Path(spec_path), files.rank)
        self._spec = spec_path
        self._shim = _start_shim(spec_path, files)
        identity = read_identity(self._shim.pid)
        self._identity = None if identity is None else (identity.pid, identity.start_ticks)

    def where(self) -> Placed:
        """The node this replica runs on: Ray's node id, its IP, the host name."""
        import ray

        context = ray.get_runtime_context()
        return Placed(node_id=context.get_node_id(), ip=ray_calls.node_ip(),
                      hostname=socket.gethostname(), shim=self._identity)

    def poll(self) -> int | None:
        """The shim's exit status once it ended (and reaped), else None."""
        return self._shim.poll()

    def wait_and_exit(self) -> None:
        """Wait for the shim to end, then end the actor: its name and bundle are freed, and
        nothing of the replica is left on the node. Called once, right after the start (the
        actor is threaded: `where`, `poll` and `stop` still answer meanwhile)."""
        self._shim.wait()
        ray_calls.exit_actor()

    def stop(self) -> bool:
        """SIGTERM to the shim, which runs the grace and the SIGKILL; False when it ended."""
        if self._identity is None or self._shim.poll() is not None:
            return False
        return send_signal(ProcessIdentity(*self._identity), signal.SIGTERM)


def _rank_of(spec_path: str) -> int:
    """The rank in `rank-<r>.spec.json`."""
    name = os.path.basename(spec_path)
    return int(name.split(".", 1)[0].removeprefix("rank-"))


def _start_shim(spec_path: str, files: RankFiles) -> subprocess.Popen[bytes]:
    # `-P` keeps the attempt directory (its cwd) off `sys.path`, as LocalLauncher does.
    return spawn_shim([sys.executable, "-P", "-m", SHIM, spec_path], files.attempt_dir, None,
                      files.shim_log)


@functools.cache
def replica_actor() -> Any:
    """`ReplicaOwner` as a Ray actor class (imports Ray)."""
    import ray

    # Threaded: `wait_and_exit` blocks in one thread while the others answer.
    decorate: Any = ray.remote
    return decorate(num_cpus=0, max_concurrency=4)(ReplicaOwner)
