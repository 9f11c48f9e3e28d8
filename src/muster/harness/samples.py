"""Per-rank sample accounting: how many samples each epoch fed this rank.

Verification compares the ranks' sums with the data manifest, so a loop that silently
skipped part of the data does not pass as a success.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from muster.atomic import atomic_write_json
from muster.harness.arguments import check_count
from muster.harness.heartbeat import Progress


class Samples:
    """`ctx.samples`: counts per epoch, rewritten to the rank's samples file when changed."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self._rank = rank
        self.last: Progress | None = None  # (time, None) of the latest call: progress
        self._epochs: dict[int, int] = {}
        self._version = 0
        self._written_version = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    def seen(self, n: int, *, epoch: int) -> None:
        """Count `n` more samples fed to this rank in `epoch` (a progress call).

        Raises:
            TypeError, ValueError: `n` or `epoch` is not an int ≥ 0.
        """
        if type(n) is not int or n < 0:
            n = check_count(n, "samples.seen: n")
        if type(epoch) is not int or epoch < 0:
            epoch = check_count(epoch, "samples.seen: epoch")
        with self._lock:
            epochs = self._epochs
            epochs[epoch] = epochs.get(epoch, 0) + n
            self._version += 1
        self.last = (time.time(), None)

    def by_epoch(self) -> dict[int, int]:
        """A copy of the counts so far, per epoch."""
        with self._lock:
            return dict(self._epochs)

    def flush(self) -> None:
        """Rewrite the samples file atomically if the counts changed since the last write.

        Raises:
            OSError: the file could not be written (the next flush tries again).
        """
        with self._write_lock:
            with self._lock:
                if self._version == self._written_version:
                    return
                epochs, version = dict(self._epochs), self._version
            atomic_write_json(self.path, {
                "rank": self._rank,
                "epochs": {str(epoch): count for epoch, count in epochs.items()},
            })
            self._written_version = version
