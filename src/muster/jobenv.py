"""The job-environment contract: every variable muster hands a training process, named once.

The platform describes a replica as a `JobEnvironment` and writes it with `to_environ()`;
`build_env` puts that over the config's variables and secrets (muster's win: a config cannot
fake its rank), and the result is what a replica's spec file stores. In the shim,
`job_environment` puts the job's variables over the environment the shim inherited (the
server's: CUDA libraries, proxies, HOME), less the server's own `MUSTER_*` settings. Inside
the trial the harness reads it back with `JobEnvironment.from_environ()`.

Standard library only: the harness imports it in every trial (docs/architecture.md, "What a
training process sees").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["DEFAULT_DIAGNOSTICS_INTERVAL", "Distributed", "JobEnvironment", "build_env",
           "diagnostics_interval", "gpu_indices", "job_environment", "job_umask"]

# Who the replica is and where its files go (docs/run-directory.md).
RUN_DIR = "MUSTER_RUN_DIR"
TRIAL_ID = "MUSTER_TRIAL_ID"
EXPERIMENT_ID = "MUSTER_EXPERIMENT_ID"  # the trial's experiment (Determined's Core API asks)
ATTEMPT = "MUSTER_ATTEMPT"
HPARAMS = "MUSTER_HPARAMS"  # the path of the trial's hyperparameters (a JSON object)
REPLICA_RESTART = "MUSTER_REPLICA_RESTART"  # restarts in place of this rank in the attempt
MUSTER_RANK = "MUSTER_RANK"  # every replica has them, distributed or not
MUSTER_WORLD_SIZE = "MUSTER_WORLD_SIZE"
LATEST_CHECKPOINT = "MUSTER_LATEST_CHECKPOINT"
# A warm start's checkpoint (`searcher.source_*`), copied into the run directory: what
# restore() hands out while the trial has no checkpoint of its own.
SOURCE_CHECKPOINT = "MUSTER_SOURCE_CHECKPOINT"
# What the config asks of the run.
HEARTBEAT_TIMEOUT = "MUSTER_HEARTBEAT_TIMEOUT"
MAX_LENGTH = "MUSTER_MAX_LENGTH"  # the searcher's max_length
SEED = "MUSTER_SEED"
DETERMINISTIC = "MUSTER_DETERMINISTIC"  # "1" with reproducibility.deterministic
DIAGNOSTICS = "MUSTER_DIAGNOSTICS"  # "off", or the interval in optimizer steps
STANDBY_GO = "MUSTER_STANDBY_GO"  # a warm standby's go file (muster.harness.standby)
INTEGRATIONS = "MUSTER_INTEGRATIONS"  # "auto": the frameworks' import hook (muster.startup)
COMPAT = "MUSTER_COMPAT"  # "determined": muster's Core API package imports as `determined`
# Set by `muster up` in the server's own environment: the umask its user had, which the
# shim gives each job back (the server runs with 077). Never a job's variable.
JOB_UMASK = "MUSTER_JOB_UMASK"
# Every name of muster's starts so: a config may set none, and the server's own settings
# (MUSTER_HOME, MUSTER_DB...) never reach a job.
MUSTER_PREFIX = "MUSTER_"

# What torchrun gives each process it starts, and muster a replica of a distributed trial
# (GROUP_RANK: the node's number, GROUP_WORLD_SIZE: how many nodes; 0 and 1 on one node).
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
TORCHRUN_VARIABLES = frozenset({RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
                                MASTER_PORT, GROUP_RANK, GROUP_WORLD_SIZE})

CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
VIRTUAL_ENV = "VIRTUAL_ENV"  # the trial's own environment layer
TORCH_DISTRIBUTED_DEBUG = "TORCH_DISTRIBUTED_DEBUG"  # "DETAIL" with debug.torch_distributed
# Every job's: its output reaches the log as it is written, in one encoding.
ALWAYS = {"PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
# Set for every rank with `reproducibility.deterministic: true`: str hashing stops being
# randomised, and cuBLAS gets the workspace its deterministic kernels need.
DETERMINISTIC_VARIABLES = {"PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# torch's flight recorder: the variables that turn its buffer on (the older NCCL-only name
# and the newer one), and those that say where it dumps.
FLIGHT_RECORDER_BUFFERS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_FILES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# What a config may set itself over muster's value: it was asked for by name.
CHOSEN_BY_THE_JOB = frozenset({*DETERMINISTIC_VARIABLES, *FLIGHT_RECORDER_FILES})
# What only the platform knows of a run: a run started without muster ignores it.
PLATFORM_IDENTITY = frozenset({RUN_DIR, TRIAL_ID, EXPERIMENT_ID, ATTEMPT, HPARAMS,
                               REPLICA_RESTART, LATEST_CHECKPOINT, SOURCE_CHECKPOINT})
# What would point the trial's `python` at another environment than its own.
OTHER_ENVIRONMENTS = frozenset({"PYTHONHOME", "CONDA_PREFIX", "CONDA_DEFAULT_ENV"})

DEFAULT_DIAGNOSTICS_INTERVAL = 20  # optimizer steps between gradient-norm and hash samples


@dataclass(frozen=True, kw_only=True)
class Distributed:
    """torchrun's variables: what torchrun gives each process it starts, and muster each
    replica of a distributed trial (all on one node, as local ranks, unless the Ray
    launcher says where the group placed each rank)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None
    local_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    group_rank: int | None = None
    group_world_size: int | None = None

    @classmethod
    def on_one_node(cls, rank: int, world_size: int, master_addr: str,
                    master_port: int) -> Distributed:
        """Rank `rank` of `world_size` processes on one node (node 0 of 1, as torchrun
        says of a single node)."""
        return cls(rank=rank, world_size=world_size, local_rank=rank,
                   local_world_size=world_size, master_addr=master_addr,
                   master_port=master_port, group_rank=0, group_world_size=1)

    def to_environ(self) -> dict[str, str]:
        values = {RANK: self.rank, LOCAL_RANK: self.local_rank, WORLD_SIZE: self.world_size,
                  LOCAL_WORLD_SIZE: self.local_world_size, MASTER_ADDR: self.master_addr,
                  MASTER_PORT: self.master_port, GROUP_RANK: self.group_rank,
                  GROUP_WORLD_SIZE: self.group_world_size}
        return {name: str(value) for name, value in values.items() if value is not None}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Distributed | None:
        """torchrun's variables where RANK or WORLD_SIZE is set (a missing one: rank 0 of
        1); None where neither is.

        Raises:
            ValueError: one is malformed, or RANK is not smaller than WORLD_SIZE.
        """
        if not environ.get(RANK) and not environ.get(WORLD_SIZE):
            return None
        rank, world_size = _rank_of(environ, RANK, WORLD_SIZE)
        return cls(rank=rank, world_size=world_size,
                   local_rank=_integer(environ, LOCAL_RANK, minimum=0),
                   local_world_size=_integer(environ, LOCAL_WORLD_SIZE, minimum=1),
                   master_addr=environ.get(MASTER_ADDR) or None,
                   master_port=_integer(environ, MASTER_PORT, minimum=1),
                   group_rank=_integer(environ, GROUP_RANK, minimum=0),
                   group_world_size=_integer(environ, GROUP_WORLD_SIZE, minimum=1))


@dataclass(frozen=True, kw_only=True)
class JobEnvironment:
    """Every value muster hands a training process through its environment.

    Only the run directory is required: a variable muster always writes may still be
    missing where a test or a person starts the harness by hand, and then means what the
    harness has always taken it to mean (attempt 1, rank 0 of 1, diagnostics on...).
    """

    run_dir: Path
    trial_id: int | None = None
    experiment_id: int | None = None
    attempt: int = 1
    hparams_path: Path | None = None
    rank: int = 0  # muster's: the replica's, whatever torchrun's says
    world_size: int = 1
    incarnation: int = 0  # restarts in place of this rank within the attempt
    # torchrun's variables (`launch.torchrun.wants_distributed_env`); None: none at all.
    distributed: Distributed | None = None
    latest_checkpoint: Path | None = None  # the checkpoint to resume from
    # a warm start's checkpoint, for a trial without one of its own (`RunDir.source`)
    source_checkpoint: Path | None = None
    heartbeat_timeout: float | None = None  # seconds
    max_length: int | None = None  # the searcher's max_length
    seed: int | None = None  # the trial's seed, from reproducibility.experiment_seed
    deterministic: bool = False  # reproducibility.deterministic
    # Optimizer steps between the harness's diagnostics samples (diagnostics.interval);
    # None: diagnostics.record is off.
    diagnostics_interval: int | None = DEFAULT_DIAGNOSTICS_INTERVAL
    # The GPU indices allocated to this replica; () for none on a server that schedules
    # GPUs (the replica then sees no GPU); None where muster schedules no GPUs at all.
    gpus: tuple[int, ...] | None = None
    distributed_debug: bool = False  # debug.torch_distributed: detail
    # Where torch's flight recorder dumps (the attempt's directory, where a stall's
    # evidence bundle finds it); set for a job that turns the recorder's buffer on.
    flight_recorder: Path | None = None
    virtual_env: Path | None = None  # the trial's own environment layer
    standby_go: Path | None = None  # a warm standby waits in init() for this file
    integrations: bool = False  # `integrations` is active: the import hook attaches callbacks
    compat: str | None = None  # `compat`: "determined"

    def to_environ(self) -> dict[str, str]:
        """The variables that say all this (muster's own; `build_env` adds the job's)."""
        env = {RUN_DIR: str(self.run_dir), ATTEMPT: str(self.attempt),
               REPLICA_RESTART: str(self.incarnation), MUSTER_RANK: str(self.rank),
               MUSTER_WORLD_SIZE: str(self.world_size), **ALWAYS,
               DIAGNOSTICS: ("off" if self.diagnostics_interval is None
                             else str(self.diagnostics_interval))}
        optional = {TRIAL_ID: self.trial_id, EXPERIMENT_ID: self.experiment_id,
                    HPARAMS: self.hparams_path,
                    LATEST_CHECKPOINT: self.latest_checkpoint, MAX_LENGTH: self.max_length,
                    SOURCE_CHECKPOINT: self.source_checkpoint,
                    SEED: self.seed, VIRTUAL_ENV: self.virtual_env,
                    STANDBY_GO: self.standby_go, COMPAT: self.compat,
                    INTEGRATIONS: "auto" if self.integrations else None}
        env.update({name: str(value) for name, value in optional.items() if value is not None})
        if self.distributed is not None:
            env.update(self.distributed.to_environ())
        if self.heartbeat_timeout is not None:
            env[HEARTBEAT_TIMEOUT] = _seconds(self.heartbeat_timeout)
        if self.deterministic:
            env.update({DETERMINISTIC: "1", **DETERMINISTIC_VARIABLES})
        if self.gpus is not None:
            # NVML numbers GPUs in PCI bus order; CUDA by default fastest first. The same
            # order for both, so index i here is GPU i in `muster cluster status`.
            env.update({CUDA_DEVICE_ORDER: "PCI_BUS_ID",
                        CUDA_VISIBLE_DEVICES: ",".join(map(str, self.gpus))})
        if self.distributed_debug:
            env[TORCH_DISTRIBUTED_DEBUG] = "DETAIL"
        if self.flight_recorder is not None:
            env.update(dict.fromkeys(FLIGHT_RECORDER_FILES, str(self.flight_recorder)))
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> JobEnvironment:
        """The job `environ` describes (variables it does not know are ignored).

        Raises:
            ValueError: MUSTER_RUN_DIR is not set, or a variable is malformed (named).
        """
        run_dir = environ.get(RUN_DIR)
        if not run_dir:
            raise ValueError(f"{RUN_DIR} is not set: muster did not start this process")
        rank, world_size = _rank_of(environ, MUSTER_RANK, MUSTER_WORLD_SIZE)
        return cls(
            run_dir=Path(run_dir), trial_id=_integer(environ, TRIAL_ID, minimum=0),
            experiment_id=_integer(environ, EXPERIMENT_ID, minimum=0),
            attempt=_integer(environ, ATTEMPT, minimum=1) or 1,
            hparams_path=_path(environ, HPARAMS), rank=rank, world_size=world_size,
            incarnation=_integer(environ, REPLICA_RESTART, minimum=0) or 0,
            distributed=Distributed.from_environ(environ),
            latest_checkpoint=_path(environ, LATEST_CHECKPOINT),
            source_checkpoint=_path(environ, SOURCE_CHECKPOINT),
            heartbeat_timeout=_timeout(environ),
            max_length=_integer(environ, MAX_LENGTH, minimum=1),
            seed=_integer(environ, SEED, minimum=0),
            deterministic=environ.get(DETERMINISTIC) == "1",
            diagnostics_interval=diagnostics_interval(environ), gpus=gpu_indices(environ),
            distributed_debug=environ.get(TORCH_DISTRIBUTED_DEBUG) == "DETAIL",
            flight_recorder=_path(environ, *FLIGHT_RECORDER_FILES),
            virtual_env=_path(environ, VIRTUAL_ENV), standby_go=_path(environ, STANDBY_GO),
            integrations=environ.get(INTEGRATIONS) == "auto",
            compat=environ.get(COMPAT) or None,
        )

    def process_rank(self) -> tuple[int, int]:
        """This process's rank and world size: torchrun's where set (muster's, or those of
        the processes a torchrun entrypoint starts, which inherit muster's own); else
        muster's, which every replica has (`resources.distributed_env` may leave torchrun's
        out)."""
        if self.distributed is not None:
            return self.distributed.rank, self.distributed.world_size
        return self.rank, self.world_size


def build_env(user_vars: Mapping[str, str], job: JobEnvironment) -> dict[str, str]:
    """The job's own variables: the user's (config variables and secrets), then muster's.

    The flight recorder's dump files are set only for a job that turns its buffer on; the
    determinism switches and dump files a config names itself keep its value.
    """
    if not any(user_vars.get(name, "0") not in ("", "0") for name in FLIGHT_RECORDER_BUFFERS):
        job = replace(job, flight_recorder=None)
    env = {**user_vars, **job.to_environ()}
    env.update({name: user_vars[name] for name in CHOSEN_BY_THE_JOB if name in user_vars})
    return env


def job_environment(inherited: Mapping[str, str], job: Mapping[str, str],
                    path: Sequence[str] | None = None) -> dict[str, str]:
    """What the training process starts with: `inherited` without the server's `MUSTER_*`
    settings, torchrun's variables and Python settings that would point it at another
    environment, then the job's own variables (`build_env`), and `path` (its environment's
    `bin` directories) first on PATH: `python` and `pip` are its environment's, never
    muster's own venv."""
    env = {name: value for name, value in inherited.items()
           if not name.startswith(MUSTER_PREFIX) and name not in OTHER_ENVIRONMENTS
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
    """The umask the training process gets back (`JOB_UMASK`), if one was noted."""
    text = inherited.get(JOB_UMASK)
    try:
        return None if text is None else int(text, 8) & 0o777
    except ValueError:
        return None


def diagnostics_interval(environ: Mapping[str, str]) -> int | None:
    """The sampling interval MUSTER_DIAGNOSTICS sets; None when diagnostics are off.

    Raises:
        ValueError: the variable is neither "off" nor a positive integer.
    """
    raw = environ.get(DIAGNOSTICS, "").strip()
    if not raw:
        return DEFAULT_DIAGNOSTICS_INTERVAL
    if raw == "off":
        return None
    try:
        interval = int(raw)
    except ValueError:
        interval = 0
    if interval < 1:
        raise ValueError(f"{DIAGNOSTICS} must be 'off' or a positive number of optimizer "
                         f"steps, got {raw!r}")
    return interval


def _rank_of(environ: Mapping[str, str], rank_name: str, size_name: str) -> tuple[int, int]:
    """A rank and its world size (unset: rank 0 of 1)."""
    rank = _integer(environ, rank_name, minimum=0) or 0
    world_size = _integer(environ, size_name, minimum=1) or 1
    if rank >= world_size:
        raise ValueError(f"{rank_name}={rank} must be smaller than {size_name}={world_size}")
    return rank, world_size


def _integer(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    """The integer in `name`, or None when it is unset or empty."""
    raw = environ.get(name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _path(environ: Mapping[str, str], *names: str) -> Path | None:
    """The path in the first of `names` that is set."""
    raw = next((environ[name] for name in names if environ.get(name)), None)
    return None if raw is None else Path(raw)


def _timeout(environ: Mapping[str, str]) -> float | None:
    raw = environ.get(HEARTBEAT_TIMEOUT)
    if not raw:
        return None
    try:
        seconds = float(raw.removesuffix("s"))
    except ValueError:
        raise ValueError(
            f"{HEARTBEAT_TIMEOUT} must be a number of seconds like '300', got {raw!r}"
        ) from None
    if not seconds > 0:
        raise ValueError(f"{HEARTBEAT_TIMEOUT} must be positive, got {raw!r}")
    return seconds


def _seconds(value: float) -> str:
    """`value` as short as it reads back exactly: '300' for 300.0."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def gpu_indices(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """The GPU indices CUDA_VISIBLE_DEVICES names; None where it is unset or not a list of
    indices (UUIDs, -1: a server that schedules no GPUs passes its own setting on)."""
    raw = environ.get(CUDA_VISIBLE_DEVICES)
    if raw is None:
        return None
    if not raw:
        return ()
    words = raw.split(",")
    return tuple(map(int, words)) if all(w.isascii() and w.isdigit() for w in words) else None
