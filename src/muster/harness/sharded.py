"""A sharded save as one rank sees it: the directory every rank writes into, and its part.

Every rank of the attempt enters the same sharded save in the same order, so each derives
the same directory from the step, the attempt and the save's number in it
(`checkpoint_files.sharded_name`) without talking to the others. A rank other than 0 writes
its part file once its part is written (or that it gave up); rank 0 waits for those, then
publishes the directory like any other save. Rank 0 writes its own part file only when it
gives up, so a directory whose every rank wrote one is one nobody writes into any more.

`PendingSave` is the handle of a save written in the background (`dcp.async_save`).
Standard library only, like the rest of `muster.harness`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from muster import checkpoint_files
from muster.atomic import atomic_write_json
from muster.checkpoint_files import PartDocument

PARTS_TIMEOUT_S = 120.0  # rank 0 waits this long for the other ranks' parts, by default
FIRST_POLL_S = 0.005
LAST_POLL_S = 0.1


class Waitable(Protocol):
    """What a background write returns: `concurrent.futures.Future`, say."""

    def result(self, timeout: float | None = None) -> object: ...


@dataclass(frozen=True)
class ShardedSave:
    """This rank's view of one sharded save in progress."""

    path: Path
    step: int
    rank: int
    world_size: int

    def finish_part(self) -> None:
        """Say this rank's part is written (ranks other than 0: rank 0 publishes instead).

        Raises:
            OSError: the part file could not be written.
        """
        self._write_part(None)

    def give_up(self, error: str) -> None:
        """Say this rank is done with the directory without a part; best effort (a rank
        that cannot write it leaves the directory to its attempt's end)."""
        with contextlib.suppress(OSError):
            self._write_part(error)

    def other_ranks_problem(self, timeout: float, dropped: Callable[[], bool]) -> str | None:
        """Rank 0: wait until every other rank's part is written; why the save cannot be
        published (a rank failed, or did not finish within `timeout` seconds), or None."""
        deadline = time.monotonic() + timeout
        delay = FIRST_POLL_S
        while True:
            progress = checkpoint_files.sharded_progress(self.path, self.world_size)
            if progress.problem is not None or not progress.waiting_for:
                return progress.problem
            if dropped():
                return "muster.harness.init() ended before every rank had written its part"
            if time.monotonic() >= deadline:
                waiting = ", ".join(str(rank) for rank in progress.waiting_for)
                return (f"rank {waiting} did not say within {timeout:g} s that its part is "
                        "written (a rank that died or saves another step)")
            time.sleep(delay)
            delay = min(delay * 2, LAST_POLL_S)

    def _write_part(self, error: str | None) -> None:
        document = PartDocument(rank=self.rank, world_size=self.world_size, ok=error is None,
                                error=error, time=time.time())
        atomic_write_json(checkpoint_files.part_file(self.path, self.rank), document)


class PendingSave:
    """A sharded save written in the background; `result()` waits for it.

    On rank 0 it ends once the checkpoint is published (or not); on the other ranks once
    this rank's part is written. A failure is recorded like any failed save, whether or not
    `result()` is ever called.
    """

    def __init__(self, path: Path, step: int) -> None:
        self.path = path  # the directory being written
        self.step = step
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._committed = False
        self._dropped = False
        self._published: Path | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until it ended, at most `timeout` seconds; whether it did."""
        return self._ended.wait(timeout)

    def result(self, timeout: float | None = None) -> Path | None:
        """The published checkpoint on rank 0, None on the other ranks, once it ended.

        Raises:
            TimeoutError: it did not end within `timeout` seconds.
            muster.harness.CheckpointError: the save failed (and was recorded).
        """
        if not self._ended.wait(timeout):
            raise TimeoutError(f"the sharded checkpoint for step {self.step} is still being "
                               f"written ({self.path.name})")
        if self._error is not None:
            raise self._error
        return self._published

    def commit(self) -> bool:
        """Claim the last step (the part file, or the rename into place); False once dropped."""
        with self._lock:
            self._committed = not self._dropped
            return self._committed

    def drop(self) -> bool:
        """Give it up unless its last step began; whether it was dropped."""
        with self._lock:
            self._dropped = not self._committed
            return self._dropped

    def dropped(self) -> bool:
        return self._dropped

    def end(self, published: Path | None, error: BaseException | None) -> None:
        self._published, self._error = published, error
        self._ended.set()
