"""LocalLauncher: one shim process per replica on this machine (see `muster.launch.shim`).

The launcher starts shims and reads their files; it keeps no state that matters. A new
instance in a restarted server describes and cancels replicas it never started, from the
attempt directory and process identities alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from muster.atomic import atomic_write_bytes, atomic_write_json, json_bytes, read_json
from muster.errors import LaunchError
from muster.launch import forkserver
from muster.launch.base import Launcher, LaunchRequest, ProcessIdentity, ReplicaSpec, ReplicaStatus
from muster.launch.forkserver import ForkServerError
from muster.launch.identity import group_members, is_alive, read_identity, send_signal
from muster.launch.logs import FileLog, LogPart
from muster.launch.records import exit_record_from_json, spec_to_json
from muster.rundir import CONTROL_FILES, AttemptDir, RankFile, RankFiles
from muster.states import ReplicaPhase

__all__ = ["LOG_WAIT_S", "SHIM", "LocalLauncher", "archive_control_files", "identity_from",
           "last_alive", "log_caught_up", "modified_at", "spawn_shim", "status_of"]

log = logging.getLogger(__name__)

_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
SHIM = "muster.launch.shim"  # the shim's module: `python -P -m muster.launch.shim SPEC`
# How long an exit record waits for its log's last bytes to show here (`log_caught_up`).
LOG_WAIT_S = 60.0


class LocalLauncher(Launcher):
    """Runs each replica under its own shim, in its own session, on this machine."""

    # A live shim that has not published its child this long after launch is reported LOST.
    STARTUP_WINDOW_S = 30.0

    def __init__(self) -> None:
        self._shims: dict[tuple[Path, int], subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        # Set once this process handles SIGUSR1: shims started from then on send it when
        # their replica has ended (`ReplicaSpec.notify`), so it need not wait for a poll.
        self.notify: ProcessIdentity | None = None

    def plan(self, spec: ReplicaSpec) -> LaunchRequest:
        """The spec file, and the shim that reads it (`python -P -m muster.launch.shim
        SPEC`, in its attempt directory; forked by the fork server where it runs)."""
        if self.notify is not None and spec.notify is None:
            spec = dataclasses.replace(spec, notify=(self.notify.pid, self.notify.start_ticks))
        files = RankFiles(spec.attempt_dir, spec.rank)
        # `-P` keeps the attempt directory (its cwd) off `sys.path`.
        return LaunchRequest(spec=spec, argv=[sys.executable, "-P", "-m", SHIM, str(files.spec)],
                             cwd=spec.attempt_dir,
                             files={files.spec: json_bytes(spec_to_json(spec))})

    def _act(self, request: LaunchRequest) -> ProcessIdentity:
        """Write the spec, start its shim, record the shim's identity; returns that identity."""
        spec = request.spec
        files = RankFiles(spec.attempt_dir, spec.rank)
        where = f"rank {spec.rank} of trial {spec.trial_uuid} attempt {spec.attempt}"
        try:
            self._prepare(request, files)
            shim = self._start_shim(request, files, where)
        except OSError as exc:
            raise LaunchError(f"Could not launch {where} in {spec.attempt_dir}: {exc}") from exc
        return self._record_launch(shim, files, where)

    def warm_up(self) -> None:
        """Start the shim fork server ahead of the first launch (where it is on)."""
        forks = forkserver.shared()
        if forks is None:
            return
        try:
            forks.start()
        except ForkServerError as exc:
            log.warning("%s; shims will be started as new interpreters", exc)

    def describe(self, attempt_dir: Path, rank: int) -> ReplicaStatus:
        """The replica's phase from its files and the identities they name (no pids alone)."""
        self._reap_shims()
        files = RankFiles(attempt_dir, rank)
        status = read_json(files.status)
        shim = identity_from(status, "shim") or identity_from(read_json(files.launch), "shim")
        child = identity_from(status, "child")
        alive = _alive(shim) or _alive(child)
        # Read the exit record after the liveness check: a shim writes it before it dies, so
        # a dead shim without a record here really ended without one.
        exit_data = read_json(files.exit)
        stop_at = modified_at(files.stop)
        phase: ReplicaPhase | None
        if exit_data is not None and not log_caught_up(files, exit_data):
            # It ended, but its log's last bytes do not show here yet: not ended for muster.
            exit_data, phase = None, ReplicaPhase.RUNNING
        else:
            phase = (None if exit_data is not None
                     else self._live_phase(files, status, shim, alive))
        lost_at = (last_alive(files, status, read_json(files.launch))
                   if phase is ReplicaPhase.LOST else None)
        return status_of(rank, phase, status, exit_data, shim, child, stop_at, lost_at)


    def _deliver_stop(self, attempt_dir: Path, rank: int) -> None:
        """SIGTERM the shim (which runs the grace and the SIGKILL). If the shim is gone but
        its child's group lives on, nobody is left to run a grace period, so the group gets
        SIGKILL at once."""
        files = RankFiles(attempt_dir, rank)
        status = read_json(files.status)
        shim = identity_from(status, "shim") or identity_from(read_json(files.launch), "shim")
        if shim is not None and send_signal(shim, signal.SIGTERM):
            return
        child = identity_from(status, "child")
        if shim is not None and child is not None:
            _kill_orphaned_group(shim, child)

    def archive(self, attempt_dir: Path, rank: int, incarnation: int) -> None:
        """Move the ended incarnation's control files (`rundir.CONTROL_FILES`) to
        `restarts/`; the log and its index stay (the shim appends to them and indexes from
        their end)."""
        files = RankFiles(attempt_dir, rank)
        if _alive(identity_from(read_json(files.status), "child")):
            raise LaunchError(f"rank {rank} of {attempt_dir} is still running; only an ended "
                              "replica can be archived")
        archive_control_files(attempt_dir, rank, incarnation)

    def log(self, attempt_dir: Path, rank: int) -> FileLog:
        files = RankFiles(attempt_dir, rank)
        return FileLog(rank, files.log, files.index, files.dropped)

    def logged_ranks(self, attempt_dir: Path) -> list[int]:
        return [rank for rank, _ in AttemptDir(attempt_dir).ranks_with(RankFile.LOG)]

    def _prepare(self, request: LaunchRequest, files: RankFiles) -> None:
        """Create the attempt directory and the request's files; refuse to launch a replica
        twice."""
        spec = request.spec
        spec.attempt_dir.mkdir(parents=True, exist_ok=True)
        if files.launch.exists() or files.exit.exists():
            raise LaunchError(
                f"Rank {spec.rank} was already launched in {spec.attempt_dir}; "
                "start a new attempt in a new directory."
            )
        for path, data in request.files.items():
            atomic_write_bytes(path, data, mode=0o600)  # a spec holds the job's secrets

    def _start_shim(self, request: LaunchRequest, files: RankFiles, where: str
                    ) -> ProcessIdentity:
        """Start the shim: forked by the fork server (`launch/forkserver.py`), which has
        the shim's imports done already, or, where that is off or fails, as a new
        interpreter. Returns its identity."""
        forks = forkserver.shared()
        if forks is not None:
            try:
                return forks.start_shim(files.spec, files.attempt_dir, files.shim_log)
            except ForkServerError as exc:
                if exc.asked:
                    # A shim may exist without a launch record: the attempt fails to launch
                    # (INTERNAL, retried in a new attempt), and its cancel leaves the stop
                    # marker that such a shim obeys when it starts.
                    raise LaunchError(f"Could not launch {where}: {exc}") from exc
                log.warning("%s; starting the shim for %s as a new interpreter", exc, where)
        proc = self._spawn_shim(request, files)
        with self._lock:
            self._shims[(files.attempt_dir, files.rank)] = proc
        # Not yet reaped by us, the shim keeps its /proc entry even if it already exited.
        identity = read_identity(proc.pid)
        if identity is None:
            raise LaunchError(f"The shim for {where} vanished right after it was started.")
        return identity

    def _spawn_shim(self, request: LaunchRequest, files: RankFiles) -> subprocess.Popen[bytes]:
        return spawn_shim(request.argv, request.cwd, request.env, files.shim_log)

    def _record_launch(
        self, identity: ProcessIdentity, files: RankFiles, where: str
    ) -> ProcessIdentity:
        """Write `launch.json` (the shim's identity) so a restarted server can find the shim."""
        launch = {
            "shim_pid": identity.pid,
            "shim_start_ticks": identity.start_ticks,
            "launched_at": time.time(),
        }
        try:
            atomic_write_json(files.launch, launch)
        except OSError as exc:
            # The shim stops its child itself; it must not run untracked.
            send_signal(identity, signal.SIGTERM)
            raise LaunchError(f"Could not record the launch of {where}: {exc}") from exc
        return identity

    def _live_phase(
        self, files: RankFiles, status: Any, shim: ProcessIdentity | None, alive: bool
    ) -> ReplicaPhase:
        if status is not None:
            return ReplicaPhase.RUNNING if alive else ReplicaPhase.LOST
        launch = read_json(files.launch)
        launched_at = float(launch["launched_at"]) if launch is not None else 0.0
        if alive and time.time() - launched_at < self.STARTUP_WINDOW_S:
            return ReplicaPhase.STARTING
        return ReplicaPhase.LOST

    def _reap_shims(self) -> None:
        """Collect the exit status of shims this process started, so none stays a zombie."""
        with self._lock:
            ended = [key for key, proc in self._shims.items() if proc.poll() is not None]
            for key in ended:
                del self._shims[key]


def spawn_shim(argv: list[str], cwd: Path, env: dict[str, str] | None,
               shim_log: Path) -> subprocess.Popen[bytes]:
    """Start a shim in its own session with SIGTERM/SIGINT blocked, its stderr appended to
    `shim_log` (also how a Ray actor starts one on its node, `launch/ray_replica.py`).

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
    bytes that have not arrived by then are lost, and the attempt must end.
    """
    counted = exit_data.get("log_bytes") if isinstance(exit_data, dict) else None
    if not isinstance(counted, int) or counted <= 0:
        return True
    stream = FileLog(files.rank, files.log).open(LogPart.LOG)
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


def archive_control_files(attempt_dir: Path, rank: int, incarnation: int) -> None:
    """Move an ended replica's control files (`rundir.CONTROL_FILES`) to `restarts/`."""
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


def _alive(identity: ProcessIdentity | None) -> bool:
    return identity is not None and is_alive(identity)


def _kill_orphaned_group(shim: ProcessIdentity, child: ProcessIdentity) -> None:
    """SIGKILL the child's group if it still holds processes of this replica.

    The group's number may have been recycled once it emptied, so only members that belong
    to the shim's session and started no earlier than the child count. The child never leads
    a session of its own (a group leader cannot call setsid), so a process whose session is
    numbered like the child is one that took over the child's pid: it must not be touched.
    """
    members = [
        m
        for m in group_members(child.pid)
        if m.session == shim.pid and m.start_ticks >= child.start_ticks
    ]
    if not members:
        return
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        return  # the group emptied after the scan: nothing is left to kill


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
