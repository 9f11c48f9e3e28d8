"""Graceful stop: muster's SIGTERM (pause, kill, searcher stop) becomes a flag the loop polls.

muster stops a trial with SIGTERM to its process group, then SIGKILL after a grace period.
The handler only sets a flag, so the loop can save a checkpoint and leave at a step
boundary instead of dying in the middle of one.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any

from muster.atomic import atomic_write_json
from muster.harness.heartbeat import Heartbeat

_Handler = Any  # what signal.signal returns: a callable, SIG_DFL/SIG_IGN, or None


class StopRequest:
    """The SIGTERM flag, and the acknowledgement written when the loop first sees it."""

    def __init__(self, ack_path: Path, heartbeat: Heartbeat) -> None:
        self.ack_path = ack_path
        self._heartbeat = heartbeat
        self._requested = False
        self._acknowledged = False
        self._owner_pid = os.getpid()
        self._previous: _Handler = None
        self._installed = False

    def install(self) -> None:
        """Take over SIGTERM; Python allows that only in the main thread, elsewhere a no-op."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._owner_pid = os.getpid()
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        _INSTALLED.append(self)
        _watch_forks()

    def uninstall(self) -> None:
        """Give SIGTERM back to the handler that was there before `install`."""
        if self._installed:
            previous = signal.SIG_DFL if self._previous is None else self._previous
            signal.signal(signal.SIGTERM, previous)
            self._installed = False
            _INSTALLED.remove(self)

    def requested(self) -> bool:
        """True once SIGTERM arrived; the first True writes the stop acknowledgement."""
        if self._requested and not self._acknowledged:
            self._acknowledge()
        return self._requested

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner_pid:
            # A forked child (a DataLoader worker) inherited this handler: die as it would
            # have without the harness, rather than ignore muster's stop.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self._requested = True

    def in_forked_child(self) -> None:
        """Right after os.fork(), in the child: SIGTERM kills it again, by the kernel's
        default action, without waiting for the Python-level handler to get a turn."""
        if self._installed and os.getpid() != self._owner_pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _acknowledge(self) -> None:
        self._acknowledged = True
        try:
            atomic_write_json(self.ack_path, {"time": time.time(), "step": self._heartbeat.step})
        except OSError as exc:
            warnings.warn(f"muster.harness: could not write {self.ack_path}: {exc}",
                          RuntimeWarning, stacklevel=3)


# The StopRequests that hold SIGTERM in this process; a forked child gives it back.
_INSTALLED: list[StopRequest] = []
_FORK_HOOK = False


def _watch_forks() -> None:
    """Once per process: after os.fork() (a DataLoader worker), SIGTERM kills the child.

    The handler's own check (`_on_sigterm`) does the same, but only once the child's main
    thread runs Python again; the hook makes the default action immediate.
    """
    global _FORK_HOOK
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _FORK_HOOK = True


def _after_fork_in_child() -> None:
    for request in _INSTALLED:
        request.in_forked_child()
