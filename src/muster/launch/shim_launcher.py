"""ShimLauncher: what every backend whose replicas run under muster's shim shares.

The shim (`muster.launch.shim`) owns a replica wherever it runs and writes its files in
the attempt directory, on a file system the server reads: the spec it starts from, its
status (the shim's and the child's identities), its liveness stamp, the exit record, the
log and its index. Reading those files is the same for every backend (`describe`, `log`,
`archive_control_files`); a backend says only how a shim is started (`_act`) and how its
liveness is told (`_alive`, `_live_phase`): by process identities on this machine
(`LocalLauncher`), by an actor's name on a Ray cluster (`RayLauncher`).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from muster.atomic import atomic_write_bytes, json_bytes, read_json
from muster.errors import LaunchError
from muster.launch.base import (
    Launcher,
    LaunchRequest,
    ProcessIdentity,
    ReplicaSpec,
    ReplicaStatus,
)
from muster.launch.logs import FileLog, LogPart
from muster.launch.records import exit_record_from_json, spec_to_json
from muster.rundir import CONTROL_FILES, AttemptDir, RankFile, RankFiles
from muster.states import ReplicaPhase

__all__ = ["LOG_WAIT_S", "SHIM", "ShimFiles", "ShimLauncher", "archive_control_files",
           "identity_from", "last_alive", "log_caught_up", "modified_at", "spawn_shim",
           "status_of"]

log = logging.getLogger(__name__)

_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
SHIM = "muster.launch.shim"  # the shim's module: `python -P -m muster.launch.shim SPEC`
# How long an exit record waits for its log's last bytes to show here (`log_caught_up`).
LOG_WAIT_S = 60.0


class ShimFiles:
    """One replica's shim files, each read once, when first asked for."""

    def __init__(self, attempt_dir: Path, rank: int) -> None:
        self.paths = RankFiles(attempt_dir, rank)

    @cached_property
    def status(self) -> Any:
        """The shim's status file (its and its child's identities, the child's start)."""
        return read_json(self.paths.status)

    @cached_property
    def launch(self) -> Any:
        """The launch record the launcher wrote once the shim started."""
        return read_json(self.paths.launch)

    @property
    def shim(self) -> ProcessIdentity | None:
        # The status names the shim once it runs; the launch record before that.
        return identity_from(self.status, "shim") or identity_from(self.launch, "shim")

    @property
    def child(self) -> ProcessIdentity | None:
        return identity_from(self.status, "child")


class ShimLauncher(Launcher):
    """A launcher whose replicas each run under muster's shim, from a spec file in the
    attempt directory, writing the files this class reads."""

    # The interpreter that runs the shim, as the machine that starts it names it.
    python: ClassVar[str]

    def plan(self, spec: ReplicaSpec) -> LaunchRequest:
        """The spec file, and the shim that reads it (`python -P -m muster.launch.shim
        SPEC`, in its attempt directory)."""
        files = RankFiles(spec.attempt_dir, spec.rank)
        # `-P` keeps the attempt directory (its cwd) off `sys.path`.
        return LaunchRequest(spec=spec, argv=[self.python, "-P", "-m", SHIM, str(files.spec)],
                             cwd=spec.attempt_dir,
                             files={files.spec: json_bytes(spec_to_json(spec))})

    def describe(self, attempt_dir: Path, rank: int) -> ReplicaStatus:
        """The replica's phase from its files, and whether what runs it is alive."""
        files = ShimFiles(attempt_dir, rank)
        alive = self._alive(files)
        # Read the exit record after the liveness check: a shim writes it before it dies, so
        # a dead shim without a record here really ended without one.
        exit_data = read_json(files.paths.exit)
        stop_at = modified_at(files.paths.stop)
        phase: ReplicaPhase | None = None
        if exit_data is not None and not log_caught_up(files.paths, exit_data):
            # It ended, but its log's last bytes do not show here yet: not ended for muster
            # (nor LOST, though what ran it may be gone).
            exit_data, phase = None, ReplicaPhase.RUNNING
        elif exit_data is None:
            phase = self._live_phase(files, alive)
        lost_at = (last_alive(files.paths, files.status, files.launch)
                   if phase is ReplicaPhase.LOST else None)
        return status_of(rank, phase, files.status, exit_data, files.shim, files.child,
                         stop_at, lost_at)

    def log(self, attempt_dir: Path, rank: int) -> FileLog:
        files = RankFiles(attempt_dir, rank)
        return FileLog(rank, files.log, files.index, files.dropped)

    def logged_ranks(self, attempt_dir: Path) -> list[int]:
        return [rank for rank, _ in AttemptDir(attempt_dir).ranks_with(RankFile.LOG)]

    @abc.abstractmethod
    def _alive(self, files: ShimFiles) -> bool:
        """Whether what runs the replica (its shim, or its owner) is alive now."""

    @abc.abstractmethod
    def _live_phase(self, files: ShimFiles, alive: bool) -> ReplicaPhase:
        """The phase of a replica without an exit record, `alive` or not."""

    def _prepare(self, spec: ReplicaSpec, files: dict[Path, bytes]) -> None:
        """Create the attempt directory and write `files` (a spec holds the job's secrets);
        refuse to launch a replica twice.

        Raises:
            LaunchError: the rank was launched in this attempt directory already.
            OSError: the directory or a file could not be written.
        """
        spec.attempt_dir.mkdir(parents=True, exist_ok=True)
        rank_files = RankFiles(spec.attempt_dir, spec.rank)
        if rank_files.launch.exists() or rank_files.exit.exists():
            raise LaunchError(f"Rank {spec.rank} was already launched in {spec.attempt_dir}; "
                              "start a new attempt in a new directory.", rank=spec.rank)
        for path, data in files.items():
            atomic_write_bytes(path, data, mode=0o600)


def spawn_shim(argv: list[str], cwd: Path, env: dict[str, str] | None,
               shim_log: Path) -> subprocess.Popen[bytes]:
    """Start a shim in its own session with SIGTERM/SIGINT blocked, its stderr appended to
    `shim_log` (how `LocalLauncher` starts one here, and a Ray actor one on its node,
    `launch/ray_replica.py`).

    The shim inherits the blocked mask and unblocks it once its handlers are installed,
    so a cancel that arrives while its interpreter starts is delivered, not lost.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(shim_log, flags, 0o644), "ab") as log_file:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=log_file,
                                    start_new_session=True, close_fds=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def status_of(rank: int, live: ReplicaPhase | None, status: Any, exit_data: Any,
              shim: ProcessIdentity | None, child: ProcessIdentity | None,
              stop_at: float | None, lost_at: float | None = None) -> ReplicaStatus:
    """A replica's status from what its files say: EXITED with its record when there is
    one, else `live` (the launcher's judgement of a replica without one); `lost_at` is a
    LOST replica's `last_alive`."""
    if exit_data is not None:
        record = exit_record_from_json(exit_data)
        return ReplicaStatus(rank, ReplicaPhase.EXITED, shim, child, record,
                             stop_at is not None or record.stop_requested, stop_at,
                             record.started_at)
    if live is None:
        raise ValueError(f"rank {rank}: a replica without an exit record needs its live phase")
    started_at = status.get("started_at") if isinstance(status, dict) else None
    return ReplicaStatus(rank, live, shim, child, None, stop_at is not None, stop_at,
                         float(started_at) if isinstance(started_at, int | float) else None,
                         lost_at if live is ReplicaPhase.LOST else None)


def last_alive(files: RankFiles, status: Any, launch: Any) -> float | None:
    """The last time the replica was known alive: its shim's liveness stamp
    (`RankFile.ALIVE`, kept fresh while the shim runs), else its training process's start
    (`status`), else its launch (`launch`); None without a trace of it."""
    times = [float(data[key]) for data, key in ((status, "started_at"), (launch, "launched_at"))
             if isinstance(data, dict) and isinstance(data.get(key), int | float)]
    # No stamp: a shim that never got to supervise its child; its start or launch says it.
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        times.append(os.lstat(files.alive).st_mtime)
    return max(times, default=None)


def log_caught_up(files: RankFiles, exit_data: Any, now: float | None = None) -> bool:
    """Whether muster may trust the exit record `exit_data` (its JSON): the replica's log,
    opened anew, holds every byte the record counts (`log_bytes`).

    The shim syncs the log before it writes the record, but on a file system the nodes share
    the record can show up here before the log's last bytes do; opening the log makes such a
    file system look again. A record trusted earlier would end the attempt on a short log.
    Past `LOG_WAIT_S` after the replica's end it is trusted anyway, the shortfall logged:
    bytes that have not arrived by then are lost, and the attempt must end. So it is at once
    when the log's path holds something other than a regular file (the job swapped it for a
    link, which muster never follows): no wait would bring the bytes back.
    """
    counted = exit_data.get("log_bytes") if isinstance(exit_data, dict) else None
    if not isinstance(counted, int) or counted <= 0:
        return True
    stream = FileLog(files.rank, files.log).open(LogPart.LOG)
    if stream is None and _not_a_file(files.log):
        log.warning("%s is not a regular file (a link, or a directory: the job replaced its "
                    "log); trusting its exit record at once: the %d bytes it counts are lost",
                    files.log, counted)
        return True
    if stream is None:
        size = 0
    else:
        with stream:
            size = os.fstat(stream.fileno()).st_size
    if size >= counted:
        return True
    ended_at = exit_data.get("ended_at")
    waited = (now if now is not None else time.time()) - (
        float(ended_at) if isinstance(ended_at, int | float) else 0.0)
    if waited < LOG_WAIT_S:
        return False
    log.warning("%s holds %d of the %d bytes its exit record counts, %.0f s after the "
                "replica ended; trusting the record: the rest is lost", files.log, size,
                counted, waited)
    return True


def _not_a_file(path: Path) -> bool:
    """Whether `path` holds something, and it is not a regular file (not followed)."""
    try:
        return not stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False  # not there (yet, on a shared file system): the wait goes on


def archive_control_files(attempt_dir: Path, rank: int, incarnation: int) -> None:
    """Move an ended replica's control files (`rundir.CONTROL_FILES`) to `restarts/`; the
    log and its index stay (the shim appends to them and indexes from their end)."""
    files = RankFiles(attempt_dir, rank)
    for kind in CONTROL_FILES:
        path = files.path(kind)
        if os.path.lexists(path):
            target = files.archived(kind, incarnation)
            _real_directory(target.parent)
            path.rename(target)


def identity_from(data: Any, role: str) -> ProcessIdentity | None:
    """The `<role>_pid`/`<role>_start_ticks` pair from a shim or launch file, if present."""
    if not isinstance(data, dict) or data.get(f"{role}_pid") is None:
        return None
    return ProcessIdentity(int(data[f"{role}_pid"]), int(data[f"{role}_start_ticks"]))


def modified_at(path: Path) -> float | None:
    """When `path` was last written (the stop request's time), or None if it is absent."""
    try:
        return path.stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None


def _real_directory(path: Path) -> None:
    """Make `path` a directory of this process's own, replacing a link or a file in its
    place (under `run_as` the job owns the attempt's directory: moving muster's files
    through a link it planted would put them wherever it points)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        path.mkdir()
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()
    path.mkdir()
