"""A replica's log held to `resources.log_limit`, and the lines muster itself writes into a log.

A log that reaches its limit keeps its head and a rolling tail (docs/run-directory.md):

```
[0, marker)              the head: the first output, about half the limit
[marker, hole_start)     one line: "── muster: 2.1 GiB of output dropped here ... ──"
[hole_start, tail)       dropped: punched out of the file (a hole), never shown
[tail, size)             the tail: the latest output, a little under half the limit
```

Nothing is moved: every offset (the index's, a follower's, a scan's cursor) keeps meaning
the same byte, and the file's allocated size stays within the limit while its size goes on
growing. The shim (`LogCap`) announces each dropped range in the log's record,
`rank-<r>.log.dropped` (`LogDrops`, atomic), before it punches the range out
(fallocate(2) FALLOC_FL_PUNCH_HOLE), so a reader (`muster.launch.logs.open_log`) that looks
at the record after each read never shows a punched byte. The count in the marker line is
rewritten in place (its width is fixed) each time the hole grows.

Where the file system cannot punch holes, the shim keeps the head and the marker, writes
nothing more while the child runs, holds the latest output in memory instead (at most
`RING_MAX_BYTES`) and appends it, after a second marker, when the child has exited.

Standard library only: the shim imports it (ctypes only once a log reaches its limit).
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from muster.atomic import atomic_write_json, json_bytes, open_regular
from muster.sizes import format_size

__all__ = ["MAX_RANGES", "MIN_LOG_LIMIT", "RING_MAX_BYTES", "CapPlan", "LogCap", "LogDrops",
           "dropped_marker", "lost_marker", "read_drops"]

log = logging.getLogger("muster.shim")

MIN_LOG_LIMIT = 1 << 20
RING_MAX_BYTES = 64 << 20  # the latest output held in memory where holes cannot be punched
MAX_RANGES = 64  # in a record; more is no record the shim wrote
_RECORD_MAX_BYTES = 64 * 1024
_STEP_MIN, _STEP_MAX = 64 * 1024, 64 << 20
_BLOCK_MIN, _BLOCK_MAX = 512, 64 * 1024
_SIZE_WIDTH = 12  # the most characters a size takes in the marker line (99999.9 TiB)
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def lost_marker(lost: int, error: str) -> bytes:
    """The line written where output could not be written (a full disk), once it can be."""
    return f"\n── muster: {format_size(lost)} of output lost here: {error} ──\n".encode()


def _dropped_text(dropped: str, limit: int) -> str:
    return (f"\n── muster: {dropped} of output dropped here: the log reached "
            f"resources.log_limit ({format_size(limit)}); the latest output follows ──")


def dropped_marker(dropped: int, limit: int) -> bytes:
    """The line between a capped log's head and its tail, padded with spaces to
    `marker_bytes(limit)`, so that its count can be rewritten in place."""
    text = _dropped_text(format_size(dropped), limit).encode()
    return text + b" " * (marker_bytes(limit) - len(text) - 1) + b"\n"


def marker_bytes(limit: int) -> int:
    return len(_dropped_text("x" * _SIZE_WIDTH, limit).encode()) + 1


@dataclass(frozen=True)
class LogDrops:
    """A log's record of what the shim dropped from it to hold it to its limit.

    `ranges` are the dropped byte ranges [start, end), in order, never shown; `dropped` is
    every byte dropped (where holes cannot be punched, bytes never written count too);
    `marker` is the offset of the marker line (None: it could not be written), `hole_start`
    where the rolling tail began; `holes`: False once the latest output is held in memory.
    """

    limit: int
    ranges: tuple[tuple[int, int], ...] = ()
    dropped: int = 0
    marker: int | None = None
    holes: bool = True
    hole_start: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"limit": self.limit, "ranges": [list(r) for r in self.ranges],
                "dropped_bytes": self.dropped, "marker": self.marker, "holes": self.holes,
                "hole_start": self.hole_start}

    @classmethod
    def from_json(cls, data: object) -> LogDrops:
        """Raises ValueError for anything the shim would not have written."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        ranges = data.get("ranges")
        if not isinstance(ranges, list) or len(ranges) > MAX_RANGES:
            raise ValueError("ranges must be a list of at most 64 [start, end] pairs")
        pairs = tuple(_pair(r) for r in ranges)
        if any(a[1] > b[0] for a, b in itertools.pairwise(pairs)):
            raise ValueError("ranges must be in order and apart")
        marker, hole_start = data.get("marker"), data.get("hole_start")
        return cls(limit=_count(data.get("limit")), ranges=pairs,
                   dropped=_count(data.get("dropped_bytes")),
                   marker=None if marker is None else _count(marker),
                   holes=data.get("holes") is not False,
                   hole_start=None if hole_start is None else _count(hole_start))

    def skip(self, offset: int) -> int:
        """`offset`, or the end of the dropped range it lies in."""
        for start, end in self.ranges:
            if start <= offset < end:
                return end
        return offset

    def room(self, offset: int) -> int | None:
        """How many bytes from `offset` (not dropped) come before the next dropped range;
        None: no range follows."""
        starts = [start for start, _ in self.ranges if start >= offset]
        return starts[0] - offset if starts else None

    def back(self, end: int) -> int:
        """`end`, or the start of the dropped range that ends at or holds the byte before it."""
        for start, stop in self.ranges:
            if start < end <= stop:
                return start
        return end

    def floor(self, end: int) -> int:
        """Where the kept stretch that ends at `end` starts: the end of the last dropped
        range before it (0 when none)."""
        return max((stop for _, stop in self.ranges if stop <= end), default=0)

    def spans(self, start: int, end: int) -> list[tuple[int, int]]:
        """The kept stretches of [start, end), in order."""
        spans, at = [], self.skip(start)
        for first, stop in self.ranges:
            if first >= end:
                break
            if stop <= at:
                continue
            if first > at:
                spans.append((at, first))
            at = max(at, stop)
        if at < end:
            spans.append((at, end))
        return spans

    def dropped_within(self, end: int) -> int:
        """Dropped bytes before `end`."""
        return sum(max(0, min(stop, end) - start) for start, stop in self.ranges)


def _pair(value: object) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("a range must be [start, end]")
    start, end = _count(value[0]), _count(value[1])
    if end <= start:
        raise ValueError("a range must end after it starts")
    return start, end


def _count(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"expected a count of bytes, got {value!r}")


def read_drops(path: Path) -> tuple[bytes, LogDrops | None]:
    """The record at `path` as bytes and parsed; (b"", None) where there is none. One a job
    tampered with (it owns its attempt's directory under `run_as`) reads as none: its log
    is then shown as it lies on disk."""
    try:
        fd = open_regular(path)
    except OSError:
        return b"", None
    with os.fdopen(fd, "rb") as file:
        data = file.read(_RECORD_MAX_BYTES)
    try:
        return data, LogDrops.from_json(json.loads(data))
    except ValueError:
        return data, None


@dataclass(frozen=True)
class CapPlan:
    """How a log of `limit` bytes is split: `head` bytes kept from its start, then the
    marker line, then at least `tail` bytes of its latest output; the tail may grow by
    `step` before older output is dropped (each drop rewrites the record and the marker),
    and `block` is the unit holes are punched in. Head + marker + tail + step, with a
    partial block at each end of the hole, make the limit."""

    limit: int
    head: int
    tail: int
    step: int
    block: int
    marker: int

    @classmethod
    def of(cls, limit: int, block: int) -> CapPlan:
        if limit < MIN_LOG_LIMIT:
            raise ValueError(f"log_limit must be at least 1MiB, got {limit}")
        block = min(max(block, _BLOCK_MIN), _BLOCK_MAX)
        step = min(max(limit // 16, _STEP_MIN), _STEP_MAX) // block * block
        marker = marker_bytes(limit)
        head = limit // 2 - marker - block
        return cls(limit, head, limit - head - marker - 2 * block - step, step, block, marker)


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's fallocate(2), which `os` lacks (os.posix_fallocate cannot punch); None where
    there is none."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int

    def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
        return 0 if function(fd, mode, offset, length) == 0 else ctypes.get_errno()

    return fallocate


class LogCap:
    """The shim's side of the limit for one log: where the head ends, what to drop and when.

    The pump (`muster.launch.shim.LogPump`) writes every byte itself and asks this object
    only past `next_at`: `head_room` bytes still go to the head; `begin` once it has written
    the marker line; `make_room` before each write past `next_at` in the rolling phase;
    `keep` for each chunk once the latest output is held in memory instead (`in_memory`);
    `finish` at the end. A log that reached its limit under an earlier incarnation of the
    replica (a restart in place appends to it) goes on from its record.
    """

    def __init__(self, limit: int, log_fd: int, record: Path) -> None:
        self.plan = CapPlan.of(limit, os.fstat(log_fd).st_blksize)
        self._fd, self._record = log_fd, record
        self._fallocate: Callable[[int, int, int, int], int] | None = None
        self._ring: _Ring | None = None
        self._ring_dropped = 0  # of `dropped`, what the ring pushed out
        self._counting = False  # the marker line's count is kept up to date (holes are punched)
        self.dropped = 0
        self.marker: int | None = None
        self.hole_start: int | None = None  # None: still in the head
        self.drop_to = 0
        self._punched_to = 0  # where the hole punched so far ends
        _, earlier = read_drops(record)
        if earlier is not None and earlier.limit == limit and earlier.hole_start is not None:
            self._resume(earlier, earlier.hole_start)

    def _resume(self, earlier: LogDrops, hole_start: int) -> None:
        self.dropped, self.marker, self.hole_start = earlier.dropped, earlier.marker, hole_start
        self.drop_to = earlier.ranges[-1][1] if earlier.ranges else hole_start
        self._counting = earlier.holes or bool(earlier.ranges)
        if not earlier.holes or not self._can_punch():
            self._to_memory()

    @property
    def next_at(self) -> int:
        """The offset a write may reach before the pump must ask this object."""
        if self.hole_start is None:
            return self.plan.head
        if self._ring is not None:
            return -1  # every chunk goes to memory
        return self.drop_to + self.plan.tail + self.plan.step

    @property
    def in_memory(self) -> bool:
        return self._ring is not None

    @property
    def take_bytes(self) -> int:
        """The most the pump takes from the pipe at once past the head: no chunk outgrows
        the room one drop makes."""
        return self.plan.step

    def head_room(self, offset: int) -> int:
        return max(0, self.plan.head - offset)

    def marker_line(self) -> bytes:
        """The line that ends the head: one whose count is rewritten as output is dropped,
        or, where holes cannot be punched, one that says the latest output comes at the end."""
        self._counting = self._can_punch()
        if self._counting:
            return dropped_marker(0, self.plan.limit)
        return _text_line(f"the log reached resources.log_limit ({format_size(self.plan.limit)})"
                          ": from here on output is held in memory, and the latest of it "
                          "written here when the replica ends")

    def begin(self, marker: int | None, hole_start: int) -> None:
        """The head ends: the marker line is at `marker` (None: it could not be written),
        and what comes from `hole_start` on is the rolling tail."""
        self.marker, self.hole_start, self.drop_to = marker, hole_start, hole_start
        if not self._counting:
            self._to_memory()
        try:
            self._write_record()
        except OSError as exc:
            log.error("cannot record that the log reached its limit: %s", exc)

    def make_room(self, end: int) -> None:
        """Before the log grows to `end`: drop what is older than the tail, recorded before
        it is punched out."""
        assert self.hole_start is not None
        target = (end - self.plan.tail) // self.plan.block * self.plan.block
        if target <= self.drop_to:
            return
        before = self.dropped, self.drop_to
        self.dropped, self.drop_to = self.dropped + target - self.drop_to, target
        try:
            self._write_record()
        except OSError as exc:  # a full disk: nothing is dropped; the next write asks again
            log.error("cannot record the log's dropped range (%s); dropping nothing yet", exc)
            self.dropped, self.drop_to = before
            return
        start = max(-(-self.hole_start // self.plan.block) * self.plan.block, self._punched_to)
        problem = self._punch(start, target - start)
        if problem:
            log.error("cannot punch the dropped range out of the log (%s); keeping the latest "
                      "output in memory instead", os.strerror(problem))
            self._to_memory()
        else:
            self._punched_to = target
        self._rewrite_marker()

    def keep(self, data: memoryview) -> None:
        """Hold `data` (the latest output) in memory, dropping what it pushes out."""
        assert self._ring is not None
        pushed = self._ring.add(data)
        self.dropped += pushed
        self._ring_dropped += pushed

    def finish(self) -> bytes:
        """At the end: the count in the marker and the record made final; returns what the
        pump appends (the output held in memory, after a marker line of its own), or b""."""
        tail = b""
        if self._ring is not None and len(self._ring):
            kept = self._ring.contents()
            line = _text_line(
                f"{format_size(self._ring_dropped)} of output dropped here: the log reached "
                f"resources.log_limit ({format_size(self.plan.limit)}); the latest "
                f"{format_size(len(kept))} follow")
            if os.fstat(self._fd).st_size == self.hole_start:  # right after the marker line
                line = line.removeprefix(b"\n")
            tail = line + kept
        if self.hole_start is not None:
            self._rewrite_marker()
            try:
                self._write_record(durable=True)
            except OSError as exc:
                log.error("cannot record the log's dropped bytes (%s)", exc)
        return tail

    def _to_memory(self) -> None:
        self._ring = _Ring(min(RING_MAX_BYTES, self.plan.tail + self.plan.step))
        log.warning("the log reached its limit of %s where holes cannot be punched: the latest "
                    "%s of output are kept in memory and written when the replica ends",
                    format_size(self.plan.limit), format_size(self._ring.size))

    def _can_punch(self) -> bool:
        """Whether the file system punches holes: one past the end of the file is no change,
        where it can."""
        end = os.fstat(self._fd).st_size
        start = -(-end // self.plan.block) * self.plan.block + self.plan.block
        problem = self._punch(start, self.plan.block)
        if problem:
            log.info("the log's file system does not punch holes: %s", os.strerror(problem))
        return not problem

    def _punch(self, offset: int, length: int) -> int:
        """0, or the errno of the punch."""
        if length <= 0:
            return 0
        if self._fallocate is None:
            self._fallocate = _load_fallocate()
        if self._fallocate is None:
            return errno.ENOSYS
        return self._fallocate(self._fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE,
                               offset, length)

    def _write_record(self, *, durable: bool = False) -> None:
        """Replace the record atomically (a reader sees the old one or the new one). While
        the child runs, not synced: the pump must not wait on the disk at every step (a
        sync took 7 ms here, while a fast child's pipe fills). A journaling file system
        commits this rename before the punch that follows it, so a machine that crashes
        leaves no punched range the record does not name, at worst a record without its
        bytes (the hole then reads as NULs). The last one, at the end, is synced."""
        start = self.hole_start
        ranges = ((start, self.drop_to),) if start is not None and self.drop_to > start else ()
        record = LogDrops(self.plan.limit, ranges, self.dropped, self.marker,
                          self._ring is None, start).to_json()
        if durable:
            atomic_write_json(self._record, record)
        else:
            _replace(self._record, json_bytes(record))

    def _rewrite_marker(self) -> None:
        """The marker's count, rewritten in place. A log open for appending is set to write
        where it is told for the moment (pwrite would append to it)."""
        if self.marker is None or not self._counting:
            return
        import fcntl

        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        try:
            if flags & os.O_APPEND:
                fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
            shown = self.dropped - self._ring_dropped  # what the hole holds
            os.pwrite(self._fd, dropped_marker(shown, self.plan.limit), self.marker)
        except OSError as exc:
            log.error("cannot update the count in the log's marker line: %s", exc)
        finally:
            if flags & os.O_APPEND:
                fcntl.fcntl(self._fd, fcntl.F_SETFL, flags)


def _replace(path: Path, data: bytes) -> None:
    """Put `data` at `path` through a new temp file and a rename, never through a link (as
    `muster.atomic` does), without syncing either."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileExistsError:  # left by a shim that died, or planted: it goes, unread
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _text_line(text: str) -> bytes:
    return f"\n── muster: {text} ──\n".encode()


class _Ring:
    """The latest `size` bytes of what was added, in a buffer made on first use."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._buf: bytearray | None = None
        self._end = 0  # where the next byte goes
        self._filled = 0

    def __len__(self) -> int:
        return self._filled

    def add(self, data: memoryview) -> int:
        """Add `data`; returns how many bytes (older ones first) fell out."""
        if self._buf is None:
            self._buf = bytearray(self.size)
        n = len(data)
        pushed = max(0, self._filled + n - self.size)
        if n >= self.size:
            self._buf[:] = data[n - self.size:]
            self._end, self._filled = 0, self.size
            return pushed
        first = min(n, self.size - self._end)
        self._buf[self._end:self._end + first] = data[:first]
        self._buf[:n - first] = data[first:]
        self._end = (self._end + n) % self.size
        self._filled = min(self.size, self._filled + n)
        return pushed

    def contents(self) -> bytes:
        if self._buf is None:
            return b""
        if self._filled < self.size:
            return bytes(self._buf[:self._filled])
        return bytes(self._buf[self._end:] + self._buf[:self._end])
