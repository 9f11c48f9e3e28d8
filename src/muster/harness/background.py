"""The harness's one daemon thread: flushes on a cadence and rewrites the heartbeat."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple


class Task(NamedTuple):
    """`run` every `interval` seconds; `what` names it in a warning when it fails."""

    what: str
    interval: float
    run: Callable[[], None]


class BackgroundThread:
    """Runs each task on its cadence until stopped. An OSError is warned about, not fatal.

    It is a daemon thread, so a training script that never leaves `init()` (one that calls
    `os._exit`, say) is not kept alive by it.
    """

    def __init__(self, tasks: Sequence[Task]) -> None:
        self._tasks = list(tasks)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="muster-harness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to end and wait up to `timeout` seconds; True when it ended."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        due = [time.monotonic() + task.interval for task in self._tasks]
        while not self._stopping.wait(max(0.0, min(due) - time.monotonic())):
            now = time.monotonic()
            for i, task in enumerate(self._tasks):
                if now >= due[i]:
                    run_warning_on_oserror(task.what, task.run)
                    due[i] = now + task.interval


def run_warning_on_oserror(what: str, action: Callable[[], None]) -> bool:
    """Run `action`; an OSError (a full disk, say) becomes a warning. True when it worked."""
    try:
        action()
    except OSError as exc:
        warnings.warn(f"muster.harness: {what} failed: {exc}", RuntimeWarning, stacklevel=2)
        return False
    return True
