"""LocalLauncher: one shim process per replica on this machine (see `muster.launch.shim`).

The launcher starts shims and reads their files; it keeps no state that matters. A new
instance in a restarted server describes and cancels replicas it never started, from the
attempt directory and process identities alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from muster.atomic import atomic_write_json
from muster.errors import LaunchError
from muster.launch import forkserver
from muster.launch.base import (
    LauncherCapabilities,
    LaunchRequest,
    ProcessIdentity,
    ReplicaSpec,
    ReplicaStatus,
)
from muster.launch.forkserver import ForkServerError
from muster.launch.identity import group_members, is_alive, read_identity, send_signal
from muster.launch.memory import remove_orphaned_cgroups
from muster.launch.shim_launcher import (
    ShimFiles,
    ShimLauncher,
    archive_control_files,
    spawn_shim,
)
from muster.rundir import RankFiles
from muster.states import ReplicaPhase

__all__ = ["LocalLauncher"]

log = logging.getLogger(__name__)


class LocalLauncher(ShimLauncher):
    """Runs each replica under its own shim, in its own session, on this machine."""

    backend = "local"
    capabilities = LauncherCapabilities(watchable_files=True, supports_standby=True)
    python = sys.executable

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
        return super().plan(spec)

    def _act(self, request: LaunchRequest) -> ProcessIdentity:
        """Write the spec, start its shim, record the shim's identity; returns that identity."""
        spec = request.spec
        files = RankFiles(spec.attempt_dir, spec.rank)
        where = f"rank {spec.rank} of trial {spec.trial_uuid} attempt {spec.attempt}"
        try:
            self._prepare(spec, request.files)
            shim = self._start_shim(request, files, where)
        except OSError as exc:
            raise LaunchError(f"Could not launch {where} in {spec.attempt_dir}: {exc}") from exc
        return self._record_launch(shim, files, where)

    def collect_leftovers(self) -> list[str]:
        """The memory cgroups of shims that were killed (`remove_orphaned_cgroups`)."""
        return [f"memory cgroup {path.name}" for path in remove_orphaned_cgroups()]

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
        return super().describe(attempt_dir, rank)

    def _alive(self, files: ShimFiles) -> bool:
        return _alive(files.shim) or _alive(files.child)

    def _live_phase(self, files: ShimFiles, alive: bool) -> ReplicaPhase:
        if files.status is not None:
            return ReplicaPhase.RUNNING if alive else ReplicaPhase.LOST
        launch = files.launch
        launched_at = float(launch["launched_at"]) if launch is not None else 0.0
        if alive and time.time() - launched_at < self.STARTUP_WINDOW_S:
            return ReplicaPhase.STARTING
        return ReplicaPhase.LOST

    def _deliver_stop(self, attempt_dir: Path, rank: int) -> None:
        """SIGTERM the shim (which runs the grace and the SIGKILL). If the shim is gone but
        its child's group lives on, nobody is left to run a grace period, so the group gets
        SIGKILL at once."""
        files = ShimFiles(attempt_dir, rank)
        shim = files.shim
        if shim is not None and send_signal(shim, signal.SIGTERM):
            return
        child = files.child
        if shim is not None and child is not None:
            _kill_orphaned_group(shim, child)

    def archive(self, attempt_dir: Path, rank: int, incarnation: int) -> None:
        """Move the ended incarnation's control files (`rundir.CONTROL_FILES`) to
        `restarts/`; the log and its index stay (the shim appends to them and indexes from
        their end)."""
        if _alive(ShimFiles(attempt_dir, rank).child):
            raise LaunchError(f"rank {rank} of {attempt_dir} is still running; only an ended "
                              "replica can be archived")
        archive_control_files(attempt_dir, rank, incarnation)

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

    def _reap_shims(self) -> None:
        """Collect the exit status of shims this process started, so none stays a zombie."""
        with self._lock:
            ended = [key for key, proc in self._shims.items() if proc.poll() is not None]
            for key in ended:
                del self._shims[key]


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
