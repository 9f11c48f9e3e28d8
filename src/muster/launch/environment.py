"""The environment a training process sees (ARCHITECTURE.md, "What a training process sees")."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReplicaContext:
    """Who a replica is; the facts its environment is built from."""

    run_dir: Path
    trial_id: int
    attempt: int
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    hparams_path: Path
    latest_checkpoint: Path | None = None
    heartbeat_timeout: float | None = None
    incarnation: int = 0  # restarts in place of this rank within the attempt
    # The GPU indices allocated to this replica; () for none on a server that schedules
    # GPUs (the replica then sees no GPU); None where muster schedules no GPUs at all.
    gpus: tuple[int, ...] | None = None
    max_length: int | None = None  # the searcher's max_length: MUSTER_MAX_LENGTH
    seed: int | None = None  # the trial's seed: MUSTER_SEED


def build_env(
    base: Mapping[str, str], user_vars: Mapping[str, str], ctx: ReplicaContext
) -> dict[str, str]:
    """`base` (normally `os.environ`) plus the user's variables plus muster's own.

    Built from a copy of the caller's environment, never from an empty dict, so the
    training process finds what the user's shell had (CUDA libraries, proxies, HOME...).
    muster's variables win over the user's: a config cannot fake its rank.
    """
    env = dict(base)
    env.update(user_vars)
    env.update(
        {
            "MUSTER_RUN_DIR": str(ctx.run_dir),
            "MUSTER_TRIAL_ID": str(ctx.trial_id),
            "MUSTER_ATTEMPT": str(ctx.attempt),
            "MUSTER_HPARAMS": str(ctx.hparams_path),
            "MUSTER_REPLICA_RESTART": str(ctx.incarnation),
            "RANK": str(ctx.rank),
            "LOCAL_RANK": str(ctx.rank),
            "WORLD_SIZE": str(ctx.world_size),
            "LOCAL_WORLD_SIZE": str(ctx.world_size),
            "MASTER_ADDR": ctx.master_addr,
            "MASTER_PORT": str(ctx.master_port),
            "PYTHONUNBUFFERED": "1",
            "PYTHONIOENCODING": "utf-8",
        }
    )
    if ctx.heartbeat_timeout is not None:
        env["MUSTER_HEARTBEAT_TIMEOUT"] = f"{ctx.heartbeat_timeout:g}"
    for name, value in (("MUSTER_MAX_LENGTH", ctx.max_length), ("MUSTER_SEED", ctx.seed)):
        if value is not None:
            env[name] = str(value)
        else:
            env.pop(name, None)
    if ctx.latest_checkpoint is not None:
        env["MUSTER_LATEST_CHECKPOINT"] = str(ctx.latest_checkpoint)
    else:
        env.pop("MUSTER_LATEST_CHECKPOINT", None)
    if ctx.gpus is not None:
        # NVML numbers GPUs in PCI bus order; CUDA by default fastest first. The same order
        # for both, so index i here is GPU i in `muster cluster status`.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ctx.gpus))
    env["PATH"] = _path_with_interpreter_first(env.get("PATH", ""))
    return env


def _path_with_interpreter_first(path: str) -> str:
    """`python` in an entrypoint means the interpreter muster runs on (and can import muster)."""
    interpreter_dir = str(Path(sys.executable).parent)
    rest = [p for p in path.split(os.pathsep) if p and p != interpreter_dir]
    return os.pathsep.join([interpreter_dir, *rest])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now, for MASTER_PORT (one per attempt)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
