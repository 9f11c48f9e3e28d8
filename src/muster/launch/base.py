"""The Launcher interface: how the supervisor starts, observes and stops replicas, and how
the server reads their logs.

Planning is separate from doing, twice: the supervisor builds a `ReplicaSpec` (plain data)
and the launcher turns it into a `LaunchRequest` (what it will write and start: a dry run)
before it acts. Every backend (local shims now, Ray actors later) implements the same hooks
under the same template methods.

Ownership: a launcher owns processes and files under the attempt directory; it never
touches the store. The supervisor owns every state change.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from muster.atomic import atomic_write_json
from muster.errors import LaunchError
from muster.launch.accounts import Account
from muster.launch.logs import ReplicaLog, log_size, read_range
from muster.rundir import RankFiles
from muster.states import OomSource, ReplicaPhase
from muster.system_metrics import DEFAULT_INTERVAL_S

log = logging.getLogger(__name__)

# How the shim holds a replica to `ReplicaSpec.memory_limit` (see `muster.launch.memory`):
# "auto" takes a writable cgroup memory controller where there is one, else the watchdog.
MemoryEnforcement = Literal["auto", "cgroup", "watchdog"]
LOG_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as (pid, start time in clock ticks since boot, from /proc/<pid>/stat).

    A PID alone is recycled by the kernel; the pair never is (invariant 5).
    """

    pid: int
    start_ticks: int


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything needed to start one replica of one attempt: the launch plan."""

    trial_uuid: str
    attempt: int
    rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    attempt_dir: Path
    stop_grace: float = 30.0
    memory_limit: int | None = None  # bytes, for the replica's whole process group
    memory_enforcement: MemoryEnforcement = "auto"
    # The most the replica's log may hold on disk (`resources.log_limit`): past it the shim
    # keeps its head and a rolling tail (`muster.launch.log_limit`); None: no limit.
    log_limit: int | None = None
    # The process (pid, start ticks) the shim sends SIGUSR1 once the exit record is written,
    # so that it notices the end at once; None: nobody, it polls.
    notify: tuple[int, int] | None = None
    # The directories put first on PATH: the trial's environment's `bin` (its own layer,
    # then the ones below); None: the interpreter muster runs on (specs written before
    # environments existed).
    path: tuple[str, ...] | None = None
    # The Unix account the training process runs as (the cluster config's `run_as`);
    # None: the shim's own (the server's user).
    account: Account | None = None
    # It has torchrun's variables (`resources.distributed_env`): a launcher that places
    # ranks on several nodes adds their rendezvous and per-node ranks to these alone.
    distributed: bool = True
    # The replica's own GPUs (NVML indices), whose utilisation and memory its shim samples;
    # None: muster scheduled none here, and the GPUs its CUDA_VISIBLE_DEVICES names are.
    gpus: tuple[int, ...] | None = None
    # How often the shim samples the replica's resources, in seconds (the cluster config's
    # `system_metrics_interval`; `muster.launch.resources`).
    system_metrics_interval: float = DEFAULT_INTERVAL_S

    @property
    def log_path(self) -> Path:
        return RankFiles(self.attempt_dir, self.rank).log


@dataclass(frozen=True)
class OomKill:
    """The replica's process group ran out of memory: who said so (`source`), the
    `memory_limit` it had (None: none set) and the memory of the machine it ran on."""

    source: OomSource
    limit_bytes: int | None
    machine_bytes: int | None = None


@dataclass(frozen=True)
class ExitRecord:
    """What the shim wrote to its exit record (`RankFiles.exit`) when the training process ended.

    `returncode` is Python-style (negative = killed by that signal); `exit_code` is
    shell-style (128+N for a signal) and `signal` the signal's name, e.g. "SIGKILL".
    `spawn_error` is set (and the codes are None) when the entrypoint could not start.
    `oom` is set when the replica's process group ran out of memory, limit or not: the
    kernel's OOM killer struck inside its cgroup, or (no cgroup) the kernel log names one
    of its processes, or the watchdog found it over its limit. `peak_rss_bytes` is the
    group's peak memory, for every replica: its cgroup's peak usage, or the largest sum of
    its processes' RSS the shim sampled. With a memory limit, `peak_memory_bytes` is the
    group's peak as the enforcing mechanism saw it and `memory_enforcement` that mechanism.
    The memory fields are absent from records written before limits existed; records
    written before issue 31 have a bool `oom` (read as an `OomKill` or None).
    """

    returncode: int | None
    exit_code: int | None
    signal: str | None
    pid: int | None
    start_ticks: int | None
    started_at: float | None
    ended_at: float
    max_rss_bytes: int | None
    stop_requested: bool = False
    signals_sent: list[str] = field(default_factory=list)
    spawn_error: str | None = None
    spawn_errno: int | None = None
    log_bytes: int = 0
    oom: OomKill | None = None
    memory_limit_bytes: int | None = None
    peak_memory_bytes: int | None = None
    memory_enforcement: str | None = None  # "cgroup-v1", "cgroup-v2" or "watchdog"
    # Why the limit could not be enforced: the shim then killed the group (INTERNAL).
    memory_error: str | None = None
    peak_rss_bytes: int | None = None
    # Output the shim could not write to the log (a full disk, an I/O error) and why; a
    # marker line in the log says where, once one could be written.
    log_lost_bytes: int = 0
    log_lost_error: str | None = None
    # Output dropped to hold the log to `log_limit` (its head and latest output are kept).
    log_dropped_bytes: int = 0
    log_limit_bytes: int | None = None


@dataclass(frozen=True)
class ReplicaStatus:
    rank: int
    phase: ReplicaPhase
    shim: ProcessIdentity | None = None
    child: ProcessIdentity | None = None
    exit: ExitRecord | None = None
    stop_requested: bool = False
    stop_requested_at: float | None = None  # unix time muster asked it to stop, when known
    started_at: float | None = None  # unix time the training process started, once it has
    # LOST only: the last time it was known alive (its shim's liveness stamp, else its start
    # or launch). It died at or after this; when muster noticed says nothing about when.
    lost_at: float | None = None


@dataclass(frozen=True)
class LaunchRequest:
    """What `Launcher.submit` will do for one replica, decided before anything is done: the
    files it writes (atomically, before the start) and the command that starts the
    process owning the replica (the shim), with its environment and working directory.
    Plain data: a dry run prints it, a test compares it."""

    spec: ReplicaSpec  # the replica itself: its training command, environment and cwd
    argv: list[str]
    cwd: Path
    env: dict[str, str] | None = None  # None: the launcher's own environment
    files: dict[Path, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class LauncherCapabilities:
    """What a backend can do beyond the `Launcher` contract, each asked for by name (a
    backend that sets none is served by the plain passes)."""

    # Its replicas' files are on this machine's file system and their shims are processes
    # of this machine: the server may watch them (inotify, pidfds) to wake its passes.
    watchable_files: bool = False
    # A trial's next attempt may start ahead and wait (`failure_policy.warm_standby`): the
    # backend starts replicas that hold no reserved place (not where a place is reserved).
    supports_standby: bool = False


class Launcher(abc.ABC):
    """Starts, observes and stops replicas, and serves their logs.

    Contract: every method is safe to call again after a server restart (what a launcher
    needs is in the attempt directory and in process identities, never in its memory);
    `describe` and the log methods have no side effects; `cancel` is idempotent and returns
    at once. The public methods are templates over the hooks a backend implements:
    `submit` plans (`plan`, a dry run) then acts (`_act`). Where a backend's replicas may
    go is its placement's (`muster.schedule.placement`), registered by `backend`.
    """

    backend: ClassVar[str]  # its name: the cluster config's `launcher`
    capabilities: ClassVar[LauncherCapabilities] = LauncherCapabilities()

    def submit(self, spec: ReplicaSpec) -> ProcessIdentity:
        """Start the replica; return the identity of the process that owns it (the shim).

        Raises `muster.errors.LaunchError` if nothing could be started.
        """
        return self._act(self.plan(spec))

    def submit_all(self, specs: list[ReplicaSpec]) -> dict[int, ProcessIdentity]:
        """Start a replica set (one attempt's ranks); each rank's owner's identity. Here
        one after the other; a cluster launcher starts them side by side.

        Raises `LaunchError` with the `rank` that could not be launched; the caller cancels
        the set (the ranks started before it are running).
        """
        started: dict[int, ProcessIdentity] = {}
        for spec in specs:
            try:
                started[spec.rank] = self.submit(spec)
            except LaunchError as exc:
                raise LaunchError(str(exc), rank=spec.rank) from exc
        return started

    @abc.abstractmethod
    def plan(self, spec: ReplicaSpec) -> LaunchRequest:
        """What `submit` would do for `spec`; changes nothing (a dry run)."""

    @abc.abstractmethod
    def _act(self, request: LaunchRequest) -> ProcessIdentity:
        """Carry `request` out: write its files, start its command, record the launch."""

    @abc.abstractmethod
    def describe(self, attempt_dir: Path, rank: int) -> ReplicaStatus:
        """The replica's current phase, from its files and process identities. No side effects."""

    def cancel(self, attempt_dir: Path, rank: int, grace: float | None = None) -> None:
        """Ask the replica to stop: SIGTERM to its group, grace, SIGKILL. Idempotent; returns
        at once (the exit arrives later through `describe`). `grace` overrides the spec's
        `stop_grace` (seconds) for this stop; the first request's grace is the one kept.

        The request is recorded first (a replica that has not started yet obeys it when it
        does), then delivered to whatever runs now.
        """
        if not attempt_dir.is_dir():
            return  # nothing was ever launched there
        if not self._stop_recorded(attempt_dir, rank):
            try:
                self._record_stop(attempt_dir, rank, grace)
            except OSError as exc:  # a full disk: the signal alone stops what runs now
                log.warning("could not record the stop of rank %d in %s (%s); stopping it "
                            "by signal alone", rank, attempt_dir, exc)
        self._deliver_stop(attempt_dir, rank)

    def collect_leftovers(self) -> list[str]:
        """Remove what replicas whose shims were killed left on this machine (their memory
        cgroups); what was removed. Nothing, for a backend that leaves nothing here."""
        return []

    def _stop_recorded(self, attempt_dir: Path, rank: int) -> bool:
        """Whether a stop was requested for the replica already (its stop marker)."""
        return RankFiles(attempt_dir, rank).stop.exists()

    def _record_stop(self, attempt_dir: Path, rank: int, grace: float | None) -> None:
        """Record the stop request durably, where the replica's owner looks for it: the stop
        marker in the attempt directory, which the shim obeys when it starts and whose grace
        it reads when it sends the SIGTERM."""
        atomic_write_json(RankFiles(attempt_dir, rank).stop,
                          {} if grace is None else {"grace": grace})

    @abc.abstractmethod
    def _deliver_stop(self, attempt_dir: Path, rank: int) -> None:
        """Tell what runs now to stop (a signal); harmless when nothing runs."""

    @abc.abstractmethod
    def archive(self, attempt_dir: Path, rank: int, incarnation: int) -> None:
        """Move an ended replica's control files aside, so the same rank can be submitted
        again in the same attempt (a restart in place); its log and index stay, and the
        next incarnation appends to them."""

    @abc.abstractmethod
    def log(self, attempt_dir: Path, rank: int) -> ReplicaLog:
        """The replica's log and its index, as this launcher serves them (they may not
        exist yet). Everything that reads a log reads it through this."""

    @abc.abstractmethod
    def logged_ranks(self, attempt_dir: Path) -> list[int]:
        """The ranks of the attempt that have a log, in order."""

    def log_iter(self, attempt_dir: Path, rank: int, offset: int = 0) -> Iterator[bytes]:
        """The log's bytes from `offset` to its size at the time of the call, in chunks of
        at most 1 MiB; does not wait."""
        log = self.log(attempt_dir, rank)
        end = log_size(log)
        while offset < end:
            data, offset = read_range(log, offset, min(LOG_CHUNK_BYTES, end - offset))
            if not data:
                return
            yield data
