"""The environment a training process sees (ARCHITECTURE.md, "What a training process sees").

Two halves, joined where the process starts: `build_env` makes the job's own variables (the
config's variables and secrets, then muster's, which win: a config cannot fake its rank);
they are what a replica's spec file stores. `job_environment`, in the shim, puts them over
the environment the shim inherited (the server's: CUDA libraries, proxies, HOME), less the
server's own settings (`MUSTER_HOME`, `MUSTER_DB`, any other `MUSTER_*`): a job needs none
of them, and the spec file never holds a copy of the server's environment.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from muster.states import DistributedEnv


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
    deterministic: bool = False  # reproducibility.deterministic: MUSTER_DETERMINISTIC=1
    # What the harness's diagnostics record: "off", or the interval in optimizer steps
    # (diagnostics.record and .interval): MUSTER_DIAGNOSTICS.
    diagnostics: str = "20"
    distributed_debug: bool = False  # debug.torch_distributed: detail
    # Where torch's flight recorder dumps, for a job that turns its buffer on.
    flight_recorder: Path | None = None
    # torchrun's variables (RANK, MASTER_ADDR...): `wants_distributed_env`'s decision.
    distributed: bool = True


# Set for every rank with `reproducibility.deterministic: true`: str hashing stops being
# randomised, and cuBLAS gets the workspace its deterministic kernels need.
DETERMINISTIC_VARIABLES = {"PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

# What would point the trial's `python` at another environment than its own.
_OTHER_ENVIRONMENTS = frozenset({"PYTHONHOME", "CONDA_PREFIX", "CONDA_DEFAULT_ENV"})

# What torchrun gives each process it starts, and muster a replica of a distributed trial.
# Only a job's own variables hold them, never the server's environment: a trial that is not
# distributed must not find a stale rank there (GROUP_RANK: the Ray launcher's node number).
TORCHRUN_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"})
# The modules `python -m` runs as torchrun (`launch` is its deprecated older name).
TORCHRUN_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
_PYTHON = re.compile(r"python[0-9.]*")

# torch's flight recorder: the variables that turn its buffer on (the older NCCL-only name
# and the newer one), and those that say where it dumps.
FLIGHT_RECORDER_BUFFERS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_FILES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")

# Set by `muster up`: the umask its user had, which jobs get back (the server runs with 077).
JOB_UMASK_VARIABLE = "MUSTER_JOB_UMASK"


def build_env(user_vars: Mapping[str, str], ctx: ReplicaContext) -> dict[str, str]:
    """The job's own variables: the user's (config variables and secrets), then muster's."""
    env = dict(user_vars)
    env.update(
        {
            "MUSTER_RUN_DIR": str(ctx.run_dir),
            "MUSTER_TRIAL_ID": str(ctx.trial_id),
            "MUSTER_ATTEMPT": str(ctx.attempt),
            "MUSTER_HPARAMS": str(ctx.hparams_path),
            "MUSTER_REPLICA_RESTART": str(ctx.incarnation),
            "MUSTER_RANK": str(ctx.rank),
            "MUSTER_WORLD_SIZE": str(ctx.world_size),
            "PYTHONUNBUFFERED": "1",
            "PYTHONIOENCODING": "utf-8",
        }
    )
    if ctx.distributed:
        env.update(torchrun_variables(ctx))
    env["MUSTER_DIAGNOSTICS"] = ctx.diagnostics
    if ctx.distributed_debug:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if ctx.flight_recorder is not None and any(user_vars.get(name, "0") not in ("", "0")
                                               for name in FLIGHT_RECORDER_BUFFERS):
        # A job that records its collectives gets its dumps into the attempt's directory,
        # where a stall's evidence bundle finds them; a path it names itself wins.
        for name in FLIGHT_RECORDER_FILES:
            env.setdefault(name, str(ctx.flight_recorder))
    if ctx.heartbeat_timeout is not None:
        env["MUSTER_HEARTBEAT_TIMEOUT"] = f"{ctx.heartbeat_timeout:g}"
    for name, value in (("MUSTER_MAX_LENGTH", ctx.max_length), ("MUSTER_SEED", ctx.seed)):
        if value is not None:
            env[name] = str(value)
    if ctx.deterministic:
        # What determinism needs before the interpreter and CUDA start; a value the config
        # sets itself wins (it was asked for by name).
        env.update({"MUSTER_DETERMINISTIC": "1", **DETERMINISTIC_VARIABLES, **user_vars})
    if ctx.latest_checkpoint is not None:
        env["MUSTER_LATEST_CHECKPOINT"] = str(ctx.latest_checkpoint)
    if ctx.gpus is not None:
        # NVML numbers GPUs in PCI bus order; CUDA by default fastest first. The same order
        # for both, so index i here is GPU i in `muster cluster status`.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ctx.gpus))
    return env


def torchrun_variables(ctx: ReplicaContext) -> dict[str, str]:
    """What torchrun would give the replica's process (all on one node, as local ranks)."""
    return {
        "RANK": str(ctx.rank),
        "LOCAL_RANK": str(ctx.rank),
        "WORLD_SIZE": str(ctx.world_size),
        "LOCAL_WORLD_SIZE": str(ctx.world_size),
        "MASTER_ADDR": ctx.master_addr,
        "MASTER_PORT": str(ctx.master_port),
    }


def wants_distributed_env(setting: DistributedEnv, replicas: int,
                          entrypoint: Sequence[str]) -> bool:
    """Whether a trial's replicas get torchrun's variables (`resources.distributed_env`).

    `auto`: only a distributed trial, one of several replicas or one whose entrypoint is
    torchrun. Code like nanoGPT's takes its DDP path whenever RANK is set (and fails on a
    CPU without NCCL), and Hugging Face's Trainer wraps a model in a world-size-1 DDP.
    """
    if setting is DistributedEnv.AUTO:
        return replicas > 1 or launches_torchrun(entrypoint)
    return setting is DistributedEnv.ALWAYS


def launches_torchrun(argv: Sequence[str]) -> bool:
    """Whether `argv` starts torchrun: `torchrun ...`, or `python -m torch.distributed.run`
    (or `.launch`) with any python (`python3`, `python3.11`, an absolute path)."""
    if not argv:
        return False
    program = PurePath(argv[0]).name
    if program == "torchrun":
        return True
    return _PYTHON.fullmatch(program) is not None and python_module(argv[1:]) in TORCHRUN_MODULES


def python_module(args: Sequence[str]) -> str | None:
    """The module `python ARGS` runs with `-m` (after options, `-u -m`, `-Bm`, `-mNAME`);
    None for a script, `-c` or stdin."""
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--check-hash-based-pycs":  # python's one long option with a value
            rest = rest[1:]
            continue
        if not arg.startswith("-") or arg in ("-", "--"):
            return None
        if arg.startswith("--"):
            continue
        for at, letter in enumerate(arg[1:], start=2):
            if letter in "mcWX":  # the options that take a value: here, or the next word
                value = arg[at:] or (rest.pop(0) if rest else "")
                if letter == "m":
                    return value or None
                if letter == "c":
                    return None
                break
    return None


def job_environment(inherited: Mapping[str, str], job: Mapping[str, str],
                    path: Sequence[str] | None = None) -> dict[str, str]:
    """What the training process starts with: `inherited` without the server's `MUSTER_*`
    settings, torchrun's variables and Python settings that would point it at another
    environment, then the
    job's own variables (`build_env`), and `path` (its environment's `bin` directories)
    first on PATH: `python` and `pip` are its environment's, never muster's own venv."""
    env = {name: value for name, value in inherited.items()
           if not name.startswith("MUSTER_") and name not in _OTHER_ENVIRONMENTS
           and name not in TORCHRUN_VARIABLES}
    env.update(job)
    first = [str(Path(sys.executable).parent)] if path is None else list(path)
    # muster's own interpreter directory is dropped from the rest: a trial whose
    # environment does not inherit it must not find muster's venv's programs either.
    dropped = {*first, str(Path(sys.executable).parent)}
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p not in dropped]
    env["PATH"] = os.pathsep.join([*first, *rest])
    return env


def job_umask(inherited: Mapping[str, str]) -> int | None:
    """The umask the training process gets back (`JOB_UMASK_VARIABLE`), if one was noted."""
    text = inherited.get(JOB_UMASK_VARIABLE)
    try:
        return None if text is None else int(text, 8) & 0o777
    except ValueError:
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now, for MASTER_PORT (one per attempt)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
