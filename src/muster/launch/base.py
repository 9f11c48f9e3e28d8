"""The Launcher interface: how the supervisor starts, observes and stops replicas.

Planning is separate from doing: the supervisor builds a `ReplicaSpec` (plain data, easy to
test and to show as a dry run) and a launcher executes it. Every backend (local shims now,
Ray actors later) implements the same four methods.

Ownership: a launcher owns processes and files under the attempt directory; it never
touches the store. The supervisor owns every state change.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal

from muster.rundir import RankFiles

# How the shim holds a replica to `ReplicaSpec.memory_limit` (see `muster.launch.memory`):
# "auto" takes a writable cgroup memory controller where there is one, else the watchdog.
MemoryEnforcement = Literal["auto", "cgroup", "watchdog"]


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
    # The process (pid, start ticks) the shim sends SIGUSR1 once the exit record is written,
    # so that it notices the end at once; None: nobody, it polls.
    notify: tuple[int, int] | None = None

    @property
    def log_path(self) -> Path:
        return RankFiles(self.attempt_dir, self.rank).log


@dataclass(frozen=True)
class ExitRecord:
    """What the shim wrote to its exit record (`RankFiles.exit`) when the training process ended.

    `returncode` is Python-style (negative = killed by that signal); `exit_code` is
    shell-style (128+N for a signal) and `signal` the signal's name, e.g. "SIGKILL".
    `spawn_error` is set (and the codes are None) when the entrypoint could not start.
    With a memory limit, `oom` says whether the replica's process group ran out of it (the
    limit was crossed, or the kernel's OOM killer struck inside its cgroup);
    `peak_memory_bytes` is the group's peak as the enforcing mechanism saw it (the cgroup's
    peak usage, or the watchdog's largest RSS sum), `memory_enforcement` that mechanism.
    The memory fields are absent from records written before limits existed.
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
    oom: bool = False
    memory_limit_bytes: int | None = None
    peak_memory_bytes: int | None = None
    memory_enforcement: str | None = None  # "cgroup-v1", "cgroup-v2" or "watchdog"


class ReplicaPhase(str, Enum):
    STARTING = "STARTING"  # shim launched, training process not started yet
    RUNNING = "RUNNING"  # training process alive
    EXITED = "EXITED"  # exit record written
    LOST = "LOST"  # no exit record and no live shim/process with the recorded identity


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


class Launcher(abc.ABC):
    """Starts, observes and stops replicas. Implementations must be safe to call again
    after a server restart: everything they need is in the attempt directory."""

    @abc.abstractmethod
    def submit(self, spec: ReplicaSpec) -> ProcessIdentity:
        """Start the replica; return the identity of the process that owns it (the shim).

        Raises `muster.errors.LaunchError` if nothing could be started.
        """

    @abc.abstractmethod
    def describe(self, attempt_dir: Path, rank: int) -> ReplicaStatus:
        """The replica's current phase, from its files and process identities. No side effects."""

    @abc.abstractmethod
    def cancel(self, attempt_dir: Path, rank: int, grace: float | None = None) -> None:
        """Ask the replica to stop: SIGTERM to its group, grace, SIGKILL. Idempotent; returns
        at once (the exit arrives later through `describe`). `grace` overrides the spec's
        `stop_grace` (seconds) for this stop."""

    @abc.abstractmethod
    def archive(self, attempt_dir: Path, rank: int, incarnation: int) -> None:
        """Move an ended replica's control files aside, so the same rank can be submitted
        again in the same attempt (a restart in place); its log and index stay, and the
        next incarnation appends to them."""

    @abc.abstractmethod
    def log_iter(self, attempt_dir: Path, rank: int, offset: int = 0) -> Iterator[bytes]:
        """The log's bytes from `offset` to the current end, in chunks; does not wait."""
