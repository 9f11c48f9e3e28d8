"""What wakes the orchestrator between its passes, besides requests and shims' SIGUSR1.

The passes used to find every change by looking (every 200 ms). Now the files of the
attempts a pass follows tell the server themselves, through inotify on each attempt's
directory, and the processes a pass waits on (environment builds, data scans) through a
pidfd each; the polling pass stays, every `SAFETY_NET_SECONDS`, for what no event reports
(timeouts, a cluster's nodes, a watch that could not be made).

What an event asks for (`classify`, a pure function):

- NOW, a pass at once: a replica's child started (`rank-<r>.shim.json`) or ended
  (`rank-<r>.exit.json`), a rank's first heartbeat (its check-in: RUNNING may wait for it),
  a build or scan that ended, the kernel's queue overflowing.
- SOON, a pass within `SOON_SECONDS` of the last one: new metrics lines. A script reports
  every step, so these are coalesced: a metrics file's watch is dropped at its first
  event and made again just before the next pass (which reads what was appended in
  between), so a busy file costs one event per pass, not one per line.
- nothing: logs, indexes, heartbeats after the first, the harness's other files.

Durability does not depend on any of this: a lost event only delays a pass to the next
safety-net tick, which reads the same files.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from muster import inotify
from muster.inotify import Inotify, InotifyEvent
from muster.rundir import RankFile

log = logging.getLogger(__name__)

SAFETY_NET_SECONDS = 1.0  # between passes when events report what changes
SOON_SECONDS = 0.2  # the most often new metrics lines start a pass

# An attempt directory: files appearing (atomic writes end in a rename) and leaving.
_DIR_MASK = (inotify.CREATE | inotify.MOVED_TO | inotify.CLOSE_WRITE | inotify.MOVED_FROM
             | inotify.DELETE | inotify.ONLYDIR)
_METRICS_MASK = inotify.MODIFY  # a metrics file: lines appended
_STARTED_OR_ENDED = (f".{RankFile.STATUS.value}", f".{RankFile.EXIT.value}")
_HEARTBEAT = f".{RankFile.HEARTBEAT.value}"
_METRICS = f".{RankFile.METRICS.value}"


class Wake(enum.Enum):
    NOW = "now"
    SOON = "soon"
    CHECK_IN = "check_in"  # a heartbeat: NOW when it is the rank's first
    METRICS_FILE = "metrics_file"  # a metrics file appeared: watch it, and SOON
    FORGET = "forget"  # a file left: a heartbeat written again later is a new check-in
    NONE = "none"


def classify(event: InotifyEvent, in_metrics_file: bool) -> Wake:
    """What one event of an attempt's directory (or of one of its metrics files) asks for."""
    if event.mask & inotify.Q_OVERFLOW:
        return Wake.NOW
    if in_metrics_file:
        return Wake.SOON if event.mask & inotify.MODIFY else Wake.NONE
    name = event.name
    if not name.startswith("rank-"):
        return Wake.NONE  # temporary files of atomic writes (".rank-0...tmp-1"), restarts/
    if event.mask & (inotify.MOVED_FROM | inotify.DELETE):
        return Wake.FORGET if name.endswith(_HEARTBEAT) else Wake.NONE
    if name.endswith(_STARTED_OR_ENDED) and event.mask & (inotify.MOVED_TO | inotify.CLOSE_WRITE):
        return Wake.NOW
    if name.endswith(_HEARTBEAT) and event.mask & inotify.MOVED_TO:
        return Wake.CHECK_IN
    if name.endswith(_METRICS) and event.mask & inotify.CREATE:
        return Wake.METRICS_FILE
    return Wake.NONE


@dataclass(frozen=True)
class Watched:
    """What the passes wait on: live attempts' directories by attempt id, and the pids of
    the child processes whose end a pass reads (builds, scans)."""

    attempt_dirs: Mapping[int, Path]
    pids: Collection[int]


@dataclass(frozen=True)
class _Watch:
    attempt_id: int
    path: Path
    metrics_file: bool


@dataclass
class Wakeups:
    """Turns inotify and pidfd events into `wake` calls on the event loop; see the module's
    docstring. `update` after each pass and `rearm` just before the next, on the loop."""

    loop: asyncio.AbstractEventLoop
    wake: Callable[[], None]
    notify: Inotify
    _watches: dict[int, _Watch] = field(default_factory=dict)  # wd -> what it watches
    _dirs: dict[int, int] = field(default_factory=dict)  # attempt id -> its directory's wd
    _metrics: dict[Path, int] = field(default_factory=dict)  # metrics file -> attempt id
    _disarmed: set[Path] = field(default_factory=set)  # metrics files to watch again
    _checked_in: set[tuple[int, str]] = field(default_factory=set)  # (attempt, heartbeat)
    _pidfds: dict[int, int] = field(default_factory=dict)  # pid -> its pidfd
    # Processes whose end was reported: a pass may leave one unreaped for a while (a scan
    # whose trial is not admitted yet), and a new pidfd on it would be readable at once.
    _ended: set[int] = field(default_factory=set)
    _soon: asyncio.TimerHandle | None = None
    _last_pass: float = 0.0
    _failed: bool = False

    @classmethod
    def start(cls, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]) -> Wakeups | None:
        """Wake-ups on this loop, or None where there is no inotify (polling only)."""
        notify = Inotify.open()
        if notify is None:
            return None
        wakeups = cls(loop, wake, notify)
        loop.add_reader(notify.fd, wakeups._on_inotify)
        return wakeups

    @property
    def complete(self) -> bool:
        """Whether every watch asked for was made (else the short polling interval)."""
        return not self._failed

    def update(self, watched: Watched) -> None:
        """Watch exactly the directories and processes of `watched` (after a pass)."""
        self._last_pass = time.monotonic()
        self._failed = False
        for attempt_id in set(self._dirs) - set(watched.attempt_dirs):
            self._unwatch_attempt(attempt_id)
        added = [attempt_id for attempt_id, path in watched.attempt_dirs.items()
                 if attempt_id not in self._dirs and self._watch_dir(attempt_id, path)]
        if added:
            # Files written between the launch and this watch have told no one: a pass soon
            # looks (a child's start also comes by SIGUSR1 where the shim can send it).
            self._wake_soon()
        self._follow_pids(watched.pids)

    def rearm(self) -> None:
        """Watch again the metrics files whose watch was dropped at their first event (just
        before a pass, which reads what they got in between)."""
        for path in list(self._disarmed):
            self._disarmed.discard(path)
            attempt_id = self._metrics.get(path)
            if attempt_id is not None and attempt_id in self._dirs:
                self._watch_metrics(attempt_id, path)

    def close(self) -> None:
        self.loop.remove_reader(self.notify.fd)
        for pid in list(self._pidfds):
            self._drop_pid(pid)
        if self._soon is not None:
            self._soon.cancel()
        self.notify.close()

    # -- inotify ---------------------------------------------------------------------
    def _on_inotify(self) -> None:
        urgent = soon = False
        for event in self.notify.read_events():
            if event.mask & inotify.IGNORED:
                self._watches.pop(event.wd, None)
                continue
            watch = self._watches.get(event.wd)
            if watch is None and not event.mask & inotify.Q_OVERFLOW:
                continue  # a watch removed a moment ago
            wake = classify(event, watch is not None and watch.metrics_file)
            urgent |= wake is Wake.NOW
            soon |= wake is Wake.SOON
            if watch is not None:
                urgent |= self._note(wake, watch, event)
                soon |= wake is Wake.METRICS_FILE
        if urgent:
            self.wake()
        elif soon:
            self._wake_soon()

    def _note(self, wake: Wake, watch: _Watch, event: InotifyEvent) -> bool:
        """Keep what an event changes in the watches; True when it is a first check-in."""
        key = (watch.attempt_id, event.name)
        if wake is Wake.CHECK_IN:
            first = key not in self._checked_in
            self._checked_in.add(key)
            return first
        if wake is Wake.FORGET:
            self._checked_in.discard(key)
        elif wake is Wake.METRICS_FILE:
            self._watch_metrics(watch.attempt_id, watch.path / event.name)
        elif wake is Wake.SOON and watch.metrics_file:
            self._disarm(event.wd, watch)
        return False

    def _watch_dir(self, attempt_id: int, path: Path) -> bool:
        wd = self._add(attempt_id, path, _DIR_MASK, metrics_file=False)
        if wd is None:
            return False
        self._dirs[attempt_id] = wd
        try:
            with os.scandir(path) as entries:  # a metrics file may be there already
                names = [entry.name for entry in entries]
        except OSError as exc:  # removed since: its IGNORED event drops the watch
            log.info("cannot list %s: %s", path, exc)
            return True
        for name in names:
            if name.startswith("rank-") and name.endswith(_METRICS):
                self._watch_metrics(attempt_id, path / name)
        return True

    def _watch_metrics(self, attempt_id: int, path: Path) -> None:
        self._metrics[path] = attempt_id
        self._add(attempt_id, path, _METRICS_MASK, metrics_file=True)

    def _add(self, attempt_id: int, path: Path, mask: int, metrics_file: bool) -> int | None:
        try:
            wd = self.notify.add_watch(path, mask)
        except FileNotFoundError:
            return None  # an attempt directory removed, a metrics file moved aside: no loss
        except OSError as exc:
            if not self._failed:
                log.warning("cannot watch %s (%s): the passes poll every %.1fs meanwhile",
                            path, exc, SOON_SECONDS)
            self._failed = True
            return None
        self._watches[wd] = _Watch(attempt_id, path, metrics_file)
        return wd

    def _disarm(self, wd: int, watch: _Watch) -> None:
        self._remove(wd)
        self._disarmed.add(watch.path)

    def _remove(self, wd: int) -> None:
        self._watches.pop(wd, None)
        try:
            self.notify.remove_watch(wd)
        except OSError as exc:
            log.warning("could not stop an inotify watch: %s", exc)

    def _unwatch_attempt(self, attempt_id: int) -> None:
        for wd, watch in list(self._watches.items()):
            if watch.attempt_id == attempt_id:
                self._remove(wd)
        del self._dirs[attempt_id]
        for path in [p for p, a in self._metrics.items() if a == attempt_id]:
            del self._metrics[path]
            self._disarmed.discard(path)
        self._checked_in = {key for key in self._checked_in if key[0] != attempt_id}

    def _wake_soon(self) -> None:
        if self._soon is not None:
            return
        delay = self._last_pass + SOON_SECONDS - time.monotonic()
        if delay <= 0:
            self.wake()
            return
        self._soon = self.loop.call_later(delay, self._soon_due)

    def _soon_due(self) -> None:
        self._soon = None
        self.wake()

    # -- pidfds ----------------------------------------------------------------------
    def _follow_pids(self, pids: Collection[int]) -> None:
        for pid in set(self._pidfds) - set(pids):
            self._drop_pid(pid)
        self._ended.intersection_update(pids)
        for pid in set(pids) - set(self._pidfds) - self._ended:
            try:
                fd = os.pidfd_open(pid)
            except (ProcessLookupError, AttributeError, OSError):
                self._failed = True  # ended and reaped already, or no pidfd here: poll
                continue
            self._pidfds[pid] = fd
            self.loop.add_reader(fd, self._on_pid_exit, pid)

    def _on_pid_exit(self, pid: int) -> None:
        self._drop_pid(pid)
        self._ended.add(pid)
        self.wake()

    def _drop_pid(self, pid: int) -> None:
        fd = self._pidfds.pop(pid)
        self.loop.remove_reader(fd)
        os.close(fd)
