"""The heartbeat of *progress*: when the training loop last moved, not merely that it lives.

The background thread rewrites the rank's heartbeat file every interval with the time of
the last progress call, so the supervisor can tell a loop stuck in its data loader (the
thread still writes, `progress_time` stands still) from a slow one that keeps reporting.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from muster.atomic import atomic_write_json

Progress = tuple[float, int | None]  # (unix time, step or None)


class ProgressSource(Protocol):
    """Something the loop calls that counts as progress; it keeps its latest call in `last`.

    Reading an attribute at heartbeat time, rather than calling the heartbeat on every
    report, keeps the per-step calls cheap.
    """

    @property
    def last(self) -> Progress | None: ...


class Heartbeat:
    """The latest progress of this rank, from its sources and its own calls, and its file."""

    def __init__(self, path: Path, interval: float, sources: Sequence[ProgressSource] = (),
                 integration: str = "harness") -> None:
        self.path = path
        self.interval = interval
        self.sources = list(sources)
        self.integration = integration  # what called init(): `muster.states.Integration`
        # Replaced whole, never changed in place, so the writer thread sees a consistent pair.
        self._own: Progress = (time.time(), None)  # init() is the first progress: the check-in
        self._write_lock = threading.Lock()

    def progress(self, now: float, step: int | None) -> None:
        """Note progress at `now` (an explicit heartbeat, a checkpoint); None keeps the step."""
        self._own = (now, self._own[1] if step is None else step)

    def latest(self) -> Progress:
        """The time of the latest progress, and the step of the latest progress that had one."""
        marks = [self._own, *(m for m in (s.last for s in self.sources) if m is not None)]
        stepped = [mark for mark in marks if mark[1] is not None]
        latest_step = max(stepped, key=_time_of)[1] if stepped else None
        return max(marks, key=_time_of)[0], latest_step

    @property
    def step(self) -> int | None:
        return self.latest()[1]

    def write(self) -> None:
        """Rewrite the heartbeat file atomically.

        Raises:
            OSError: the file could not be written.
        """
        progress_time, step = self.latest()
        with self._write_lock:
            atomic_write_json(self.path, {
                "progress_time": progress_time,
                "step": step,
                "pid": os.getpid(),
                "written_at": time.time(),
                "interval": self.interval,
                "integration": self.integration,
            })


def _time_of(mark: Progress) -> float:
    return mark[0]
