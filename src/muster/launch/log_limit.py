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
`rank-<r>.log.dropped` (`LogDrops`, written as invariant 6 asks: synced, renamed, its
directory synced) before it punches the range out (fallocate(2) FALLOC_FL_PUNCH_HOLE), so a
reader (`muster.launch.logs.open_log`) that looks at the record after each read never shows
a punched byte, also after a crash. The count in the marker line is rewritten in place (its
width is fixed) each time the hole grows. The syncs are a `DropWorker`'s, a thread of the
shim's: the pump, which must never keep the child waiting, only hands it each step.

Where the file system cannot punch holes, the shim keeps the head and the marker, writes
nothing more while the child runs, holds the latest output in memory instead (at most
`RING_MAX_BYTES`) and appends it, after a second marker, when the child has exited.

Standard library only: the shim imports it (ctypes only once a log reaches its limit).
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from muster.atomic import atomic_write_json, open_regular
from muster.sizes import format_size

__all__ = ["FINISH_WAIT_S", "MAX_RANGES", "MIN_LOG_LIMIT", "RING_MAX_BYTES", "CapPlan",
           "DropStep", "DropWorker", "LogCap", "LogDrops", "dropped_marker", "lost_marker",
           "read_drops"]

log = logging.getLogger("muster.shim")

MIN_LOG_LIMIT = 1 << 20
RING_MAX_BYTES = 64 << 20  # the latest output held in memory where holes cannot be punched
MAX_RANGES = 64  # in a record; more is no record the shim wrote
FINISH_WAIT_S = 30.0  # the most the end waits for the worker's last step (a disk in trouble)
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


@functools.cache
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


def _punch(fd: int, offset: int, length: int) -> int:
    """Punch [offset, offset + length) out of the file at `fd`; 0, or the errno."""
    if length <= 0:
        return 0
    fallocate = _load_fallocate()
    if fallocate is None:
        return errno.ENOSYS
    return fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length)


@dataclass(frozen=True)
class DropStep:
    """One step of a rolling tail, as the pump hands it over: the record naming all that was
    dropped so far, the range to punch once it is recorded ([start, end), whole blocks; empty:
    a record alone), and the count the marker line shows (None: its count is not kept)."""

    record: LogDrops
    punch: tuple[int, int]
    shown: int | None


class DropWorker:
    """Carries out a log's `DropStep`s on a thread of its own, in order: the record made
    durable (`atomic_write_json`: synced, renamed, the directory synced; invariant 6), only
    then its range punched out of the log, then the marker's count rewritten in place.

    The pump that hands the steps never waits for the disk (a sync of the record takes
    milliseconds, while a fast child's pipe fills): `hand` takes the lock the thread holds
    only to pick a step up, never across a write. At most one step waits besides the one
    being carried out; a newer one replaces it, which loses nothing, since a step's record
    names all that the one before named, and its punch goes on from where the last punch
    ended. The worker writes through a descriptor of the log of its own, opened through
    /proc/self/fd (the same file, never a path a job could swap) without O_APPEND, so the
    marker lands where it is told (pwrite appends on an O_APPEND descriptor). Once a punch
    is refused (or that descriptor could not be had) it punches no more and says so
    (`failure`), and still writes each record: a recorded range is dropped from view
    whether or not its bytes are gone.

    The thread starts with the first step, so never before the shim has spawned its child
    (`preexec_fn` is unsafe with another thread alive); `finish` waits for it and ends it,
    after which `carry_out` runs a last step on the caller's thread.
    """

    def __init__(self, log_fd: int, record: Path, limit: int) -> None:
        self._record, self._limit = record, limit
        self._fd, self.refused = _reopen(log_fd)  # refused: 0, or the errno of a punch
        self._cond = threading.Condition()
        self._pending: DropStep | None = None
        self._closing = False
        self._punched_to = 0  # where the hole this worker punched ends
        self._thread = threading.Thread(target=self._run, name="muster-log-drops", daemon=True)

    def hand(self, step: DropStep) -> None:
        """Give the worker `step` (replacing one it has not started); never waits on it."""
        with self._cond:
            self._pending = step
            self._cond.notify()
        if self._thread.ident is None:
            self._thread.start()

    def failure(self) -> str | None:
        """Why the log's output can no longer be punched out of it; None while it can."""
        if self.refused:
            return os.strerror(self.refused)
        if self._thread.ident is not None and not self._thread.is_alive():
            return "the thread that punches it ended (see the shim log)"
        return None

    def finish(self, timeout: float) -> bool:
        """Carry out the step handed last, then end the thread; False if that takes longer
        than `timeout` (the thread then goes on, and keeps its descriptor)."""
        if self._thread.ident is None:
            return True
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Close the worker's descriptor of the log (after `finish`); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def carry_out(self, step: DropStep) -> None:
        """Record, then punch, then count: nothing is punched or counted before a synced
        record names it (a full disk: the next step names it too)."""
        try:
            atomic_write_json(self._record, step.record.to_json())
        except OSError as exc:
            log.error("cannot record the log's dropped range (%s); punching nothing yet", exc)
            return
        self._punch_out(step.punch)
        self._count(step)

    def _run(self) -> None:
        while (step := self._next()) is not None:
            self.carry_out(step)

    def _next(self) -> DropStep | None:
        """The step to carry out next; None once `finish` asked to stop and none is left."""
        with self._cond:
            while self._pending is None and not self._closing:
                self._cond.wait()
            step, self._pending = self._pending, None
            return step

    def _punch_out(self, punch: tuple[int, int]) -> None:
        """Punch what of [start, end) is not punched yet, unless punching was refused."""
        start, end = max(punch[0], self._punched_to), punch[1]
        if end <= start or self._fd is None or self.refused:  # no descriptor: refused
            return
        self.refused = _punch(self._fd, start, end - start)
        if not self.refused:
            self._punched_to = end

    def _count(self, step: DropStep) -> None:
        """The marker's count, rewritten in place (the line is padded to a fixed width)."""
        marker = step.record.marker
        if marker is None or step.shown is None or self._fd is None:
            return
        try:
            os.pwrite(self._fd, dropped_marker(step.shown, self._limit), marker)
        except OSError as exc:
            log.error("cannot update the count in the log's marker line: %s", exc)


def _reopen(log_fd: int) -> tuple[int | None, int]:
    """A descriptor of the log at `log_fd` of the worker's own, for writing where it is told:
    (fd, 0), or (None, errno) where none can be had (an append-only file refuses one)."""
    try:
        return os.open(f"/proc/self/fd/{log_fd}", os.O_WRONLY | os.O_CLOEXEC), 0
    except OSError as exc:
        return None, exc.errno or errno.EBADF


class LogCap:
    """The shim's side of the limit for one log: where the head ends, what to drop and when.

    The pump (`muster.launch.shim.LogPump`) writes every byte itself and asks this object
    only past `next_at`: `head_room` bytes still go to the head; `begin` once it has written
    the marker line; `make_room` before each write past `next_at` in the rolling phase;
    `keep` for each chunk once the latest output is held in memory instead (`in_memory`);
    `finish` at the end. A log that reached its limit under an earlier incarnation of the
    replica (a restart in place appends to it) goes on from its record.

    The disk work of each step (the record synced, the punch, the marker's count) is a
    `DropWorker`'s, so the pump decides and moves on. The log's allocated size can therefore
    pass the limit while the worker is behind: by what the child writes while a step is
    carried out (two syncs of a small file and a punch), one step being carried out and one
    waiting at most, since a newer step replaces a waiting one. It is back within the limit
    as soon as the worker has caught up, and is within it once `finish` returned.
    """

    worker_class: ClassVar[type[DropWorker]] = DropWorker  # what carries out the steps

    def __init__(self, limit: int, log_fd: int, record: Path) -> None:
        self.plan = CapPlan.of(limit, os.fstat(log_fd).st_blksize)
        self._fd, self._record = log_fd, record
        self._worker: DropWorker | None = None  # made with the first step
        self._ring: _Ring | None = None
        self._ring_dropped = 0  # of `dropped`, what the ring pushed out
        self._counting = False  # the marker line's count is kept up to date (holes are punched)
        self.dropped = 0
        self.marker: int | None = None
        self.hole_start: int | None = None  # None: still in the head
        self.drop_to = 0  # where the dropped range ends, as handed to the worker
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
        self._hand()

    def make_room(self, end: int) -> None:
        """Before the log grows to `end`: drop what is older than the tail (the worker
        records it, then punches it out), or, once the worker can no longer punch, turn to
        holding the latest output in memory."""
        assert self.hole_start is not None
        if self._punching_failed():
            return
        target = (end - self.plan.tail) // self.plan.block * self.plan.block
        if target <= self.drop_to:
            return
        self.dropped, self.drop_to = self.dropped + target - self.drop_to, target
        self._hand()

    def keep(self, data: memoryview) -> None:
        """Hold `data` (the latest output) in memory, dropping what it pushes out."""
        assert self._ring is not None
        pushed = self._ring.add(data)
        self.dropped += pushed
        self._ring_dropped += pushed

    def finish(self) -> bytes:
        """At the end: the worker's steps carried out, the count in the marker and the
        record made final; returns what the pump appends (the output held in memory, after a
        marker line of its own), or b""."""
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
            self._finish_drops()
        return tail

    def _finish_drops(self) -> None:
        """Wait (bounded) for the worker's last step, then carry out the final one here."""
        worker = self._worker or self._new_worker()
        if not worker.finish(FINISH_WAIT_S):
            log.error("the log's dropped range is still being recorded after %.0f s (a disk "
                      "in trouble?): its record stays as that step leaves it", FINISH_WAIT_S)
            return
        worker.carry_out(self._step())
        worker.close()

    def _punching_failed(self) -> bool:
        """Whether the worker had a punch refused (the latest output then goes to memory
        from here on) or the output is held in memory already."""
        problem = None if self._worker is None else self._worker.failure()
        if problem is not None and self._ring is None:
            log.error("cannot punch the dropped range out of the log (%s); keeping the latest "
                      "output in memory instead", problem)
            self._to_memory()
        return self._ring is not None

    def _hand(self) -> None:
        if self._worker is None:
            self._worker = self._new_worker()
        self._worker.hand(self._step())

    def _new_worker(self) -> DropWorker:
        return self.worker_class(self._fd, self._record, self.plan.limit)

    def _step(self) -> DropStep:
        """The step that makes the record say what was dropped so far, and punches it out."""
        start = self.hole_start
        assert start is not None
        ranges = ((start, self.drop_to),) if self.drop_to > start else ()
        record = LogDrops(self.plan.limit, ranges, self.dropped, self.marker,
                          self._ring is None, start)
        first = -(-start // self.plan.block) * self.plan.block
        punch = (first, self.drop_to) if self._ring is None else (0, 0)
        shown = self.dropped - self._ring_dropped if self._counting else None  # in the hole
        return DropStep(record, punch, shown)

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
        problem = _punch(self._fd, start, self.plan.block)
        if problem:
            log.info("the log's file system does not punch holes: %s", os.strerror(problem))
        return not problem


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
