"""The per-replica shim: owns the training process's pipe and exit status (see "Why a shim").

Run as `python -m muster.launch.shim SPEC_JSON_PATH` in its own session, it starts the
training command in its own process group, copies every byte of its merged stdout+stderr to
its log without ever blocking it, and writes its exit record atomically when it
ends. It watches the training process's whole group's memory (`muster.launch.memory`): in
a memory cgroup of its own where one can be made, else by sampling its RSS; it records the
group's peak and any OOM kill, and holds it to its memory limit where it has one. It
samples the group's CPU, memory and GPUs into the `system/` series
(`muster.launch.resources`). It does
not need the server that started it, so a server crash or restart loses neither output nor
exit code. Its own diagnostics go to stderr (`RankFiles.shim_log`), never into the training
log.

Its files in the attempt directory are `muster.rundir.RankFiles`: it reads the spec, writes
the status, the log, its index and the exit record, and obeys the stop marker.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import cast

from muster.atomic import atomic_write_json, open_regular, read_json
from muster.errors import LaunchError
from muster.jobenv import STANDBY_GO, gpu_indices, job_environment, job_umask
from muster.launch.accounts import drop_to, job_identity
from muster.launch.activity import ActivityStamp
from muster.launch.base import ExitRecord, OomKill, ProcessIdentity, ReplicaSpec
from muster.launch.dumps import DumpRequests
from muster.launch.identity import group_members, own_identity, read_identity, send_signal
from muster.launch.log_limit import MIN_LOG_LIMIT, LogCap, lost_marker
from muster.launch.memory import (
    CgroupMemory,
    MemoryGuard,
    MemoryReport,
    machine_memory,
    open_memory_guard,
    with_child_peak,
)
from muster.launch.records import ReplicaSpecJson, exit_record_to_json, spec_from_json
from muster.launch.resources import GpuMeter, ResourceSampler
from muster.rundir import RankFiles
from muster.sizes import format_size
from muster.states import OomSource

__all__ = [
    "LivenessStamp",
    "LogPump",
    "Shim",
    "StopFlag",
    "main",
    "signal_name",
]

log = logging.getLogger("muster.shim")

CHUNK_BYTES = 1 << 20
PIPE_BYTES = 1 << 20
POLL_MS = 100
DRAIN_SILENCE_S = 2.0
DRAIN_LIMIT_S = 30.0
COALESCE_BELOW_BYTES = 256 * 1024
COALESCE_S = 0.002
WRITEBACK_BYTES = 8 << 20
WRITEBACK_ALIGN = 1 << 16
MARKER_CHECK_S = 0.25
ALIVE_STAMP_S = 1.0


def signal_name(signum: int) -> str:
    """The signal's name, e.g. SIGSEGV for 11; an unnamed real-time signal reads SIG<n>."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


class StopFlag:
    """Set by SIGTERM/SIGINT or the `.stop` marker; the pump loop acts on it.

    The signal handler only flips a flag: logging or signalling from inside a handler is not
    reentrant-safe, and the child may not exist yet when the signal arrives.
    """

    def __init__(self) -> None:
        self.requested = False
        self.cause = ""

    def request(self, cause: str) -> None:
        if not self.requested:
            self.requested, self.cause = True, cause

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request(signal_name(signum))


def _marker_grace(marker: Path, default: float) -> float:
    """The grace the stop marker asks for (`{"grace": seconds}`), else `default`."""
    try:
        data = read_json(marker)
    except (OSError, ValueError):  # an old, empty marker is not JSON: the default grace
        return default
    grace = data.get("grace") if isinstance(data, dict) else None
    return float(grace) if isinstance(grace, int | float) and grace >= 0 else default


def _ignore_hangup(signum: int, frame: FrameType | None) -> None:
    """SIGHUP must not end the shim. A handler rather than SIG_IGN, because an ignored signal
    would stay ignored in the training process across exec; a handled one resets to default."""


def install_signal_handlers(stop: StopFlag) -> None:
    """Install the handlers, then unblock what the launcher blocked during our start-up."""
    signal.signal(signal.SIGTERM, stop.on_signal)
    signal.signal(signal.SIGINT, stop.on_signal)
    signal.signal(signal.SIGHUP, _ignore_hangup)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # A parent that ignores SIGCHLD (a Ray worker does, with the raylet as subreaper) passes
    # that on: the kernel would then reap our child itself, and its exit status be lost to
    # us — and to the training process's own subprocesses.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})


def _write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _end_of(fd: int) -> int:
    """Put `fd` at its end and return that offset (its size, for a file that cannot seek)."""
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        return os.fstat(fd).st_size


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range(2), which `os` lacks; None where there is none. Loaded only once
    a log is large enough to need it, so a small job does not pay for importing ctypes."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages to disk; do not wait


class LogPump:
    """Copies the child's pipe into the log byte for byte, and notes when each chunk arrived.

    Where it can (as root: see `_open_stage`), the pump does not copy a chunk through the
    shim at all: it splices (splice(2))
    the chunk from the child's pipe into a staging pipe of its own, which only moves the pages,
    and from there into the log, the one copy, made by the kernel. That saves the shim about a
    sixth of its CPU in a burst. The staging pipe is what keeps the child writing: splicing
    straight from the child's pipe into the log holds that pipe's lock while the file is
    written, so the child waits (measured 7-20 % slower, docs/benchmarks.md); here the child's
    pipe is locked only while the pages move. Where splice is missing or refused (an
    append-only log, a file system that cannot take it) the pump reads each chunk into one
    preallocated buffer and writes it from there. The pump tracks the log's offset from the
    end it found at start, for the index, and writes at its own position (splice refuses a log
    open for appending): it must be the log's only writer.

    After a small chunk the pump naps for a moment so the next one takes many writes at once: a
    child printing line by line would otherwise cost a wake-up, a copy and an index line per
    line. The enlarged pipe holds far more than a child writes in that moment, so it does not
    block. A failing log write (disk full) is reported once in the shim log and the pipe keeps
    draining: blocking the child would be worse than losing the bytes the disk cannot take.
    Those bytes are counted (`lost_bytes`, in the exit record), and as soon as a write
    succeeds again, or at the end (`finish`), a marker line in the log says where and how
    much: "── muster: 1.2 MiB of output lost here: No space left on device ──".

    With a `LogCap` (`resources.log_limit`) the pump asks it only once a write would pass
    `LogCap.next_at`: past the head it writes the marker line, then keeps the latest output
    while the cap has older output recorded and punched out of the file by a thread of its
    own, which the pump never waits for (`muster.launch.log_limit.DropWorker`).

    Every `WRITEBACK_BYTES` the pump asks the kernel to start writing the new part of the log
    to disk (sync_file_range, SYNC_FILE_RANGE_WRITE: it does not wait for the disk). That is
    only a head start, not durability: the shim still fdatasyncs the whole log before the
    exit record, but that sync then finds little left to write.
    """

    def __init__(self, read_fd: int, log_fd: int, index_fd: int,
                 cap: LogCap | None = None) -> None:
        self._read_fd, self._log_fd, self._index_fd = read_fd, log_fd, index_fd
        self._buf = bytearray(CHUNK_BYTES)
        self._view = memoryview(self._buf)
        self._poller = select.poll()
        self._poller.register(read_fd, select.POLLIN)
        self.offset = _end_of(log_fd)
        self._stage = _open_stage(read_fd, log_fd)  # None: copy through the buffer
        self._written_back = self.offset  # where the last writeback we started ended
        self._writeback: Callable[[int, int, int, int], int] | None = None
        self._writeback_usable = True
        self.eof = False
        self.lost_bytes = 0
        self.lost_error: str | None = None  # why the last bytes were lost
        self._unmarked = 0  # lost bytes no marker line in the log tells of yet
        self._index_failed = False
        self._exit_fd: int | None = None
        self._cap = cap
        self._cap_at = sys.maxsize  # a write past this offset asks the cap first
        self._take_bytes = CHUNK_BYTES
        self._take_view = self._view
        self._kept_at = 0.0  # when the latest chunk held in memory arrived (the cap's)
        if cap is not None:
            self._follow_cap(cap)

    @property
    def dropped_bytes(self) -> int:
        """Output dropped to hold the log to its limit."""
        return 0 if self._cap is None else self._cap.dropped

    def wake_on_exit(self, pidfd: int | None) -> None:
        """Also wake `pump_once` when `pidfd` turns readable (the child exited), so that an
        exit is seen at once, not after a poll timeout; None stops watching it."""
        if self._exit_fd is not None:
            self._poller.unregister(self._exit_fd)
        self._exit_fd = pidfd
        if pidfd is not None:
            self._poller.register(pidfd, select.POLLIN)

    def pump_once(self, timeout_ms: int) -> int:
        """Wait up to `timeout_ms` for output and copy one chunk; returns the bytes taken
        (0 also when only the watched exit woke it)."""
        events = self._poller.poll(timeout_ms)
        if self.eof or not any(fd == self._read_fd for fd, _ in events):
            return 0
        stamp = time.time()
        n = self._take()
        if n == 0:
            self.eof = True
            self._poller.unregister(self._read_fd)
            self.close()
            return 0
        if self.offset + n > self._cap_at or self._unmarked:
            self._write_slowly(stamp, n)
        elif self._write(n):
            self._index(stamp, n)
            self._start_writeback()
        if n < COALESCE_BELOW_BYTES:
            time.sleep(COALESCE_S)
        return n

    @property
    def unmarked(self) -> int:
        """Output lost that no marker line in the log tells of yet (a disk still full)."""
        return self._unmarked

    def finish(self) -> None:
        """At the end, before the exit record: the output the cap held in memory, and the
        marker line for output lost at the end, where they can be written now."""
        stamp = time.time()
        if self._unmarked:
            self._mark_loss(stamp)
        tail = self._cap.finish() if self._cap is not None else b""
        if tail and self._write_bytes(self._kept_at or stamp, tail):
            return
        if self._unmarked:
            self._mark_loss(stamp)

    def close(self) -> None:
        """Close the staging pipe (at EOF the pump does this itself); idempotent."""
        stage, self._stage = self._stage, None
        if stage is not None:
            os.close(stage.read_fd)
            os.close(stage.write_fd)

    def _take(self) -> int:
        """Take the next chunk from the child's pipe, into the staging pipe or the buffer;
        returns its size (0 at EOF)."""
        if self._stage is None:
            return os.readv(self._read_fd, [self._take_view])
        return os.splice(self._read_fd, self._stage.write_fd, self._take_bytes)

    def _write(self, n: int) -> bool:
        """Write the chunk's `n` bytes to the log; False if they were dropped."""
        try:
            self._put(n)
        except OSError as exc:
            self._note_loss(n, exc)
            return False
        return True

    def _note_loss(self, n: int, exc: OSError) -> None:
        """Of `n` bytes written, those the log did not take are lost (a partial write kept
        its first bytes)."""
        if not self.lost_bytes:
            log.error("cannot write the training log (%s); output is being dropped", exc)
        end = _end_of(self._log_fd)
        self._lose(n - (end - self.offset), exc.strerror or str(exc))
        self.offset = end

    def _lose(self, n: int, error: str | None = None) -> None:
        self.lost_bytes += n
        self._unmarked += n
        self.lost_error = error or self.lost_error

    def _write_slowly(self, stamp: float, n: int) -> None:
        """A chunk that needs more than its write: a marker line before it (output was lost
        before it), or the log's limit (room made first, or a split at the head's end)."""
        if self._unmarked and not self._mark_loss(stamp):
            self._unload(n)
            self._lose(n)  # the log still takes nothing: this chunk is lost too
            return
        cap = self._cap
        if cap is not None and self.offset + n > self._cap_at:
            if cap.hole_start is not None and not cap.in_memory:
                cap.make_room(self.offset + n)
                self._cap_at = cap.next_at
            if cap.hole_start is None or cap.in_memory:
                self._unload(n)
                self._write_capped(cap, stamp, n)
                return
        if self._write(n):
            self._index(stamp, n)
            self._start_writeback()

    def _unload(self, n: int) -> None:
        """Bring the chunk's `n` bytes into the buffer (they are in the staging pipe)."""
        if self._stage is not None:
            self._stage.unload(self._view[:n])

    def _write_capped(self, cap: LogCap, stamp: float, n: int) -> None:
        """Write a chunk that reaches the log's limit: what still fits in the head, then the
        marker line; past the head, each piece after the cap made room for it (or, where it
        holds the latest output in memory, into memory)."""
        done = 0
        if cap.hole_start is None:
            done = min(n, cap.head_room(self.offset))
            self._write_piece(stamp, 0, done)
            at = self.offset
            marked = self._write_bytes(stamp, cap.marker_line(), output=False)
            cap.begin(at if marked else None, self.offset)
        while done < n and not cap.in_memory:
            piece = min(n - done, cap.take_bytes)
            if self.offset + piece > cap.next_at:
                cap.make_room(self.offset + piece)
            if not cap.in_memory:
                self._write_piece(stamp, done, piece)
                done += piece
        if done < n:
            cap.keep(self._view[done:n])
            self._kept_at = stamp
        self._follow_cap(cap)

    def _follow_cap(self, cap: LogCap) -> None:
        """Take the cap's next threshold; past the head, take chunks no larger than the room
        one drop makes; with the latest output held in memory, stop splicing (it needs the
        bytes)."""
        self._cap_at = cap.next_at
        if cap.hole_start is not None and self._take_bytes > cap.take_bytes:
            self._take_bytes = cap.take_bytes
            self._take_view = self._view[:cap.take_bytes]
        if cap.hole_start is not None:
            # Most of what comes now will be punched out again: starting its writeback
            # would only make each punch wait for it.
            self._writeback_usable = False
        if cap.in_memory:
            self.close()

    def _write_piece(self, stamp: float, start: int, count: int) -> None:
        """Write `count` bytes of the buffer from `start`, as one indexed chunk."""
        if not count:
            return
        try:
            _write_all(self._log_fd, self._view[start:start + count])
        except OSError as exc:
            self._note_loss(count, exc)
            return
        self._index(stamp, count)
        self._start_writeback()

    def _mark_loss(self, stamp: float) -> bool:
        """Write the marker line for the bytes lost since the last one; False if it could
        not be written (the bytes stay unmarked)."""
        line = lost_marker(self._unmarked, self.lost_error or "the log could not be written")
        if not self._write_bytes(stamp, line, output=False):
            return False
        self._unmarked = 0
        return True

    def _write_bytes(self, stamp: float, data: bytes, *, output: bool = True) -> bool:
        """Write `data` of the shim's own making as one indexed chunk: a marker line, or
        `output` held in memory (lost, and counted, where it cannot be written)."""
        try:
            _write_all(self._log_fd, data)
        except OSError as exc:
            if output:
                self._note_loss(len(data), exc)
            else:
                self.offset = _end_of(self._log_fd)  # the part it wrote stays
            return False
        self._index(stamp, len(data))
        return True

    def _put(self, n: int) -> None:
        """Write the chunk's `n` bytes to the log. When this raises, whatever it did not write
        is gone from the staging pipe too, so the next chunk starts empty."""
        if self._stage is None:
            _write_all(self._log_fd, self._view[:n])
            return
        left = n
        try:
            while left:
                left -= os.splice(self._stage.read_fd, self._log_fd, left)
        except OSError as exc:
            self._stage.unload(self._view[:left])
            if exc.errno not in _SPLICE_REFUSED:
                raise
            log.info("the log refuses splice(2) (%s); copying through a buffer from now on", exc)
            self.close()
            _write_all(self._log_fd, self._view[:left])

    def _index(self, stamp: float, n: int) -> None:
        try:
            _write_all(self._index_fd, f"{self.offset} {stamp:.6f}\n".encode())
        except OSError as exc:
            if not self._index_failed:
                log.error("cannot write the log index (%s); the log itself is intact", exc)
            self._index_failed = True
        self.offset += n

    def _start_writeback(self) -> None:
        """Start the disk on the log's new bytes, in whole aligned blocks (a page being written
        back may make the next write to it wait), once there are `WRITEBACK_BYTES` of them."""
        end = self.offset - self.offset % WRITEBACK_ALIGN
        if end - self._written_back < WRITEBACK_BYTES or not self._writeback_usable:
            return
        if self._writeback is None:
            self._writeback = _load_sync_file_range()
        if self._writeback is None or self._writeback(
            self._log_fd, self._written_back, end - self._written_back, _SYNC_FILE_RANGE_WRITE
        ):
            self._writeback_usable = False  # no such call, or not on this log: only a hint
            return
        self._written_back = end

    def drain(self, silence_s: float, limit_s: float) -> bool:
        """Copy until EOF; False if the pipe stayed open but silent for `silence_s`, or still
        delivered output after `limit_s` (a process that left the group keeps writing)."""
        started = last_data = time.monotonic()
        while not self.eof:
            now = time.monotonic()
            if now - last_data >= silence_s or now - started >= limit_s:
                return False
            if self.pump_once(POLL_MS):
                last_data = time.monotonic()
        return True


_SPLICE_REFUSED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


@dataclasses.dataclass(frozen=True)
class _Stage:
    """The pump's staging pipe: chunks pass through it from the child's pipe to the log."""

    read_fd: int
    write_fd: int

    def unload(self, into: memoryview) -> None:
        """Read exactly `len(into)` bytes, all the pipe holds, out of it."""
        while into:
            into = into[os.readv(self.read_fd, [into]) :]


def _open_stage(pipe_fd: int, log_fd: int) -> _Stage | None:
    """A staging pipe as large as the child's pipe `pipe_fd`, and the log at its own position
    rather than appending (splice refuses an O_APPEND file); None where that cannot be, and
    the pump then copies through its buffer."""
    if not hasattr(os, "splice"):  # not Linux
        return None
    if os.geteuid() != 0:
        # Another user's pipes share a budget of pages (/proc/sys/fs/pipe-user-pages-soft,
        # 64 MiB by default): a second 1 MiB pipe per shim would halve the shims whose child
        # pipe still gets its 1 MiB. Root's pipes are not counted.
        return None
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, fcntl.fcntl(pipe_fd, fcntl.F_GETPIPE_SZ))
        # Its reads only ever take what a failed splice left: blocking would be a bug's hang.
        os.set_blocking(read_fd, False)
        flags = fcntl.fcntl(log_fd, fcntl.F_GETFL)
        fcntl.fcntl(log_fd, fcntl.F_SETFL, flags & ~os.O_APPEND)  # EPERM: an append-only file
    except OSError as exc:
        log.info("the log is copied through a buffer, not spliced: %s", exc)
        os.close(read_fd)
        os.close(write_fd)
        return None
    return _Stage(read_fd, write_fd)


def _pidfd(pid: int) -> int | None:
    """A pidfd for the child (Linux 5.3+), readable once it exits; None where there is none
    (the loop then notices the exit within a poll timeout)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _open_append(path: Path) -> int:
    """Never through a link: under `run_as` the job owns the attempt's directory, and a link
    it put in the log's place would have this (root) process write where the link points."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW,
                   0o644)


def _open_log(path: Path) -> int:
    """The log, open for appending (an existing log is added to, never overwritten)."""
    return _open_append(path)


def _make_pipe() -> tuple[int, int]:
    """A pipe enlarged to 1 MiB where allowed, so a bursty child rarely waits for us."""
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError as exc:
        log.warning(
            "could not enlarge the pipe to %d bytes (%s); using the default", PIPE_BYTES, exc
        )
    return read_fd, write_fd


def _spawn_message(argv: list[str], cwd: Path, exc: OSError) -> str:
    """A sentence naming the program, the reason and, when different, the path at fault."""
    program = argv[0]
    reason = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno or 0, "")
    culprit = f" ({exc.filename})" if exc.filename and str(exc.filename) != program else ""
    return (
        f"Could not start the training program {program!r} in {cwd}: "
        f"{reason}{culprit} [{code or 'errno ' + str(exc.errno)}]."
    )


class LivenessStamp:
    """The replica's liveness stamp (`RankFile.ALIVE`): while the shim supervises the child it
    sets the file's mtime to now, at most every `ALIVE_STAMP_S`. A replica found LOST (its
    node died, its shim was SIGKILLed) then has a time it was last known alive, which muster
    orders against its peers' ends; when muster noticed the loss says nothing about when it
    happened. The time is this machine's clock, as the exit record's is, and set through the
    open file (never through a link put in its place)."""

    def __init__(self, path: Path) -> None:
        self._fd: int | None = None
        self._next = 0.0
        try:
            self._fd = _open_append(path)
        except OSError as exc:
            log.error("cannot create the liveness stamp %s (%s): a loss of this replica will "
                      "be ordered by its start", path, exc)

    def stamp(self) -> None:
        """Set the stamp to now, unless it was set less than `ALIVE_STAMP_S` ago."""
        now = time.monotonic()
        if self._fd is None or now < self._next:
            return
        self._next = now + ALIVE_STAMP_S
        stamp = time.time()
        try:
            os.utime(self._fd, (stamp, stamp))
        except OSError as exc:
            log.error("cannot update the liveness stamp (%s); no further attempts", exc)
            self.close()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class Shim:
    """Runs one replica's training process to its end and records how it ended."""

    def __init__(self, spec: ReplicaSpec, stop: StopFlag) -> None:
        self.spec = spec
        self.files = RankFiles(spec.attempt_dir, spec.rank)
        self.stop = stop
        self.signals_sent: list[str] = []
        self._term_sent_at: float | None = None
        self._grace = spec.stop_grace  # or the stop marker's, once a stop is enforced
        self._next_marker_check = 0.0
        self._memory: MemoryGuard | None = None
        self._out_of_memory = False
        self._dumps = DumpRequests(self.files)
        self._pump: LogPump | None = None  # once its output has been drained
        self._next_dump_check = 0.0
        self._child_env: dict[str, str] = {}  # the training process's, once spawned

    def run(self) -> int:
        """Start, pump, stop on request, reap, record. Returns the shim's own exit status."""
        self._check_marker()
        _keep_room(self.files.exit_reserve)
        log_fd = _open_log(self.files.log)
        try:
            if self.stop.requested:
                return self._record_stopped_before_start(log_fd)
            return self._run_child(log_fd)
        finally:
            os.close(log_fd)

    def _run_child(self, log_fd: int) -> int:
        if not self.spec.argv:
            return self._record_spawn_error(log_fd, "The replica has an empty command.", None)
        try:
            self._memory = self._open_memory_guard()
        except LaunchError as exc:
            return self._record_spawn_error(log_fd, str(exc), None)
        try:
            return self._start_and_supervise(log_fd)
        finally:
            if self._memory is not None:
                self._memory.close()

    def _open_memory_guard(self) -> MemoryGuard:
        spec = self.spec
        name = f"muster-{spec.trial_uuid}-a{spec.attempt}-r{spec.rank}-{os.getpid()}"
        guard = open_memory_guard(spec.memory_limit, spec.memory_enforcement, name)
        if guard.limit_bytes is not None:
            limit = format_size(guard.limit_bytes)
            log.info("memory limit %s, enforced by %s", limit, guard.mechanism)
        else:
            log.info("no memory limit; the group's memory is watched by %s", guard.mechanism)
        return guard

    def _start_and_supervise(self, log_fd: int) -> int:
        read_fd, write_fd = _make_pipe()
        try:
            try:
                proc = self._spawn(write_fd)
            except OSError as exc:
                message = _spawn_message(self.spec.argv, self.spec.cwd, exc)
                return self._record_spawn_error(log_fd, message, exc.errno)
            except subprocess.SubprocessError as exc:  # joining the memory cgroup failed
                message = f"Could not put the training program into its memory cgroup: {exc}"
                return self._record_spawn_error(log_fd, message, None)
            finally:
                os.close(write_fd)
            return self._supervise(proc, read_fd, log_fd)
        finally:
            os.close(read_fd)

    def _spawn(self, write_fd: int) -> subprocess.Popen[bytes]:
        """Start the command without a shell, in its own process group, output merged.

        With a cgroup memory limit the child joins the cgroup between fork and exec, so it and
        everything it starts are counted from their first byte. (The shim has no other thread
        yet at this point, which is what makes `preexec_fn` safe.)
        """
        env = job_environment(os.environ, self.spec.env, self.spec.path)
        if self.spec.account is not None:
            env.update(job_identity(self.spec.account))
        self._child_env = env
        proc = subprocess.Popen(
            self.spec.argv,
            cwd=self.spec.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            process_group=0,
            close_fds=True,
            preexec_fn=self._child_setup(),
        )
        log.info("started pid %d: %s", proc.pid, self.spec.argv)
        return proc

    def _child_setup(self) -> Callable[[], None] | None:
        """Between fork and exec: the user's umask back (the server's is 077, for its own
        files), then the memory cgroup (joined as root), then, under `run_as`, the job's own
        account for good."""
        umask = job_umask(os.environ)
        cgroup = self._memory.child_setup() if self._memory is not None else None
        account = self.spec.account
        if umask is None and account is None:
            return cgroup

        def setup() -> None:
            if umask is not None:
                os.umask(umask)
            if cgroup is not None:
                cgroup()
            if account is not None:
                drop_to(account)

        return setup

    def _supervise(self, proc: subprocess.Popen[bytes], read_fd: int, log_fd: int) -> int:
        started_at = time.time()
        try:
            child, ended_at, memory = self._watch(proc.pid, started_at, read_fd, log_fd)
        except BaseException:
            # Never leave an unsupervised training process behind (invariant 4).
            log.exception("shim failed while the child ran; killing its process group")
            self._killpg(proc.pid, signal.SIGKILL)
            raise
        returncode, max_rss = self._reap(proc)
        memory = self._named_by_kernel_log(memory, returncode)
        if memory is not None:
            memory = with_child_peak(memory, max_rss)
        if self._memory is not None:  # before the record, which says the shim is done
            self._memory.close()
        # The exit record promises a complete log: its bytes and size must be on disk first.
        synced = _sync_log(log_fd)
        record = self._record(returncode, child, started_at, ended_at, max_rss, log_fd)
        self._write_exit(_with_log(_with_memory(record, memory), self._pump, self.spec, synced))
        return 0

    def _watch(
        self, pid: int, started_at: float, read_fd: int, log_fd: int
    ) -> tuple[ProcessIdentity, float, MemoryReport | None]:
        """Publish the child's identity, pump until it exits, clean up its group.

        The memory report is taken after the group is killed and before the child is reaped.
        """
        child = read_identity(pid)
        if child is None:  # an unreaped child keeps its /proc entry, even as a zombie
            raise RuntimeError(f"/proc/{pid}/stat vanished before the child was reaped")
        # Before the status: once that says RUNNING, the server judges silence by the stamp.
        activity = ActivityStamp(self.files.active, started_at)
        self._write_status(child, started_at)
        if self._memory is not None:
            self._memory.watch(pid)
        resources = self._resource_sampler(pid)
        index_fd = _open_append(self.files.index)
        try:
            pump = LogPump(read_fd, log_fd, index_fd, self._log_cap(log_fd))
            ended_at = self._relay(pid, pump, activity, resources)
        finally:
            os.close(index_fd)
            activity.close()
            resources.close()
            self._dumps.close()
        memory = self._memory.finish() if self._memory is not None else None
        if memory is not None and memory.oom is not None:
            peak = "unknown" if memory.peak_bytes is None else format_size(memory.peak_bytes)
            limit = "none" if memory.limit_bytes is None else format_size(memory.limit_bytes)
            log.warning("the replica ran out of memory (limit %s, peak %s, seen by %s)",
                        limit, peak, memory.oom)
        return child, ended_at, memory

    def _named_by_kernel_log(self, memory: MemoryReport | None,
                             returncode: int) -> MemoryReport | None:
        """The report, with the OOM the kernel log names where the child did not exit
        cleanly and nothing else saw one (the watchdog, without a cgroup)."""
        if memory is None or memory.oom is not None or returncode == 0 or self._memory is None:
            return memory
        if not self._memory.killed_by_kernel():
            return memory
        return dataclasses.replace(memory, oom=OomSource.KMSG)

    def _resource_sampler(self, pgid: int) -> ResourceSampler:
        """The sampler of the replica's resources (`muster.launch.resources`), started: its
        own GPUs, or those the child was told it may use."""
        gpus = self.spec.gpus
        if gpus is None:
            gpus = gpu_indices(self._child_env) or ()
        standby_go = self.spec.env.get(STANDBY_GO)  # a warm standby: sampled once promoted
        cgroup = self._memory.path if isinstance(self._memory, CgroupMemory) else None
        sampler = ResourceSampler(self.files.system, self.spec.rank,
                                  self.spec.system_metrics_interval,
                                  GpuMeter(gpus) if gpus else None,
                                  after=Path(standby_go) if standby_go else None,
                                  procs=cgroup / "cgroup.procs" if cgroup else None)
        sampler.start(pgid)
        return sampler

    def _relay(self, pid: int, pump: LogPump, activity: ActivityStamp,
               resources: ResourceSampler) -> float:
        """Copy output until the child exits, end its group, drain; returns when it ended."""
        try:
            ended_at = self._pump_until_exit(pid, pump, activity, resources)
            self._end_group(pid, pump)
            if pump.unmarked:  # a disk still full: the kept room takes the marker line too
                _give_back(self.files.exit_reserve)
            pump.finish()
            self._pump = pump
        finally:
            pump.close()
        return ended_at

    def _log_cap(self, log_fd: int) -> LogCap | None:
        """What holds the log to the spec's `log_limit`; None without one. Made once the
        child is spawned: the thread it starts with its first step must not be alive when
        the shim forks with `preexec_fn`."""
        limit = self.spec.log_limit
        if limit is None:
            return None
        if limit < MIN_LOG_LIMIT:
            log.error("log_limit %d is below the least there is; holding the log to %s",
                      limit, format_size(MIN_LOG_LIMIT))
        return LogCap(max(limit, MIN_LOG_LIMIT), log_fd, self.files.dropped)

    def _write_status(self, child: ProcessIdentity, started_at: float) -> None:
        shim = own_identity()
        status = {
            "shim_pid": shim.pid,
            "shim_start_ticks": shim.start_ticks,
            "child_pid": child.pid,
            "child_start_ticks": child.start_ticks,
            "pgid": child.pid,
            "started_at": started_at,
        }
        atomic_write_json(self.files.status, status)
        self._notify()  # the server records RUNNING now, not at its next regular pass

    def _pump_until_exit(self, pid: int, pump: LogPump, activity: ActivityStamp,
                         resources: ResourceSampler) -> float:
        """Copy output until the child exits; returns when it ended (Unix time).

        WNOWAIT leaves the child a zombie, so its pid and process group stay reserved until
        `_reap`: signalling the group can never hit a process that reused the number. The
        liveness and activity stamps are kept fresh meanwhile, the resources sampled, and
        evidence requests served.
        """
        pidfd = _pidfd(pid)
        pump.wake_on_exit(pidfd)
        alive = LivenessStamp(self.files.alive)
        try:
            while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                alive.stamp()
                self._serve_dumps(pid)
                self._enforce_stop(pid)
                self._enforce_memory(pid)
                if pump.pump_once(POLL_MS):
                    activity.output(time.time())
                activity.tick(pid)
                resources.tick(pid)
            return time.time()
        finally:
            alive.close()
            pump.wake_on_exit(None)
            if pidfd is not None:
                os.close(pidfd)

    def _enforce_memory(self, pgid: int) -> None:
        """Once the group crossed its memory limit, or the kernel's OOM killer struck in its
        cgroup, SIGKILL all of it, once. (The kernel's OOM killer in a cgroup takes one
        process; the watchdog has killed the group already.)"""
        if self._memory is None or self._out_of_memory:
            return
        limit = ("none" if self._memory.limit_bytes is None
                 else format_size(self._memory.limit_bytes))
        if self._memory.breached():
            log.warning("the replica ran out of memory (memory limit: %s): SIGKILL to group "
                        "%d", limit, pgid)
        elif self._memory.error is not None:
            log.error("the memory limit of %s cannot be enforced (%s): SIGKILL to group %d",
                      limit, self._memory.error, pgid)
        else:
            return
        self._out_of_memory = True
        self._killpg(pgid, signal.SIGKILL)

    def _serve_dumps(self, pgid: int) -> None:
        """Look for an evidence request (and a collector that ended) every MARKER_CHECK_S."""
        now = time.monotonic()
        if now >= self._next_dump_check:
            self._next_dump_check = now + MARKER_CHECK_S
            self._dumps.poll(pgid)

    def _check_marker(self) -> None:
        now = time.monotonic()
        if self.stop.requested or now < self._next_marker_check:
            return
        self._next_marker_check = now + MARKER_CHECK_S
        if self.files.stop.exists():
            self.stop.request("stop marker")

    def _enforce_stop(self, pgid: int) -> None:
        """On a stop request: SIGTERM the group once, SIGKILL it once the grace has passed."""
        self._check_marker()
        if not self.stop.requested:
            return
        if self._term_sent_at is None:
            if self._dumps.busy:
                return  # evidence before destruction: the collector is bounded in time
            self._grace = _marker_grace(self.files.stop, self.spec.stop_grace)
            log.info("stop requested (%s): SIGTERM to group %d, SIGKILL after %.1f s",
                     self.stop.cause, pgid, self._grace)
            self._signal_group(pgid, signal.SIGTERM)
            self._term_sent_at = time.monotonic()
        elif self._grace_is_over() and "SIGKILL" not in self.signals_sent:
            log.info("still running after %.1f s of grace: SIGKILL", self._grace)
            self._signal_group(pgid, signal.SIGKILL)

    def _grace_is_over(self) -> bool:
        started = self._term_sent_at
        return started is not None and time.monotonic() - started >= self._grace

    def _signal_group(self, pgid: int, signum: signal.Signals) -> None:
        self.signals_sent.append(signum.name)
        self._killpg(pgid, signum)

    def _killpg(self, pgid: int, signum: signal.Signals) -> None:
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            # Only possible if the child moved itself out of its group and the group emptied.
            log.warning("%s to group %d: no such process group", signum.name, pgid)

    def _end_group(self, pgid: int, pump: LogPump) -> None:
        """Kill what is left of the group (invariant 4), then read the pipe to its end."""
        leftovers = [m.pid for m in group_members(pgid) if m.pid != pgid]
        if leftovers:
            log.warning(
                "child exited; killing %d processes left in its group: %s",
                len(leftovers),
                leftovers,
            )
        self._killpg(pgid, signal.SIGKILL)
        if not pump.drain(DRAIN_SILENCE_S, DRAIN_LIMIT_S):
            log.warning(
                "gave up reading the log pipe after the child's group died: a process that "
                "left the group still holds it open; its later output is not logged"
            )
        if pump.lost_bytes:
            log.error("%d bytes of output could not be written to the log", pump.lost_bytes)

    def _reap(self, proc: subprocess.Popen[bytes]) -> tuple[int, int]:
        """Reap the child; returns (Python-style returncode, max RSS in bytes)."""
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.info("pid %d ended with returncode %d", proc.pid, proc.returncode)
        return proc.returncode, rusage.ru_maxrss * 1024  # ru_maxrss is KiB on Linux

    def _record(
        self,
        returncode: int,
        child: ProcessIdentity,
        started_at: float,
        ended_at: float,
        max_rss: int,
        log_fd: int,
    ) -> ExitRecord:
        return ExitRecord(
            returncode=returncode,
            exit_code=128 - returncode if returncode < 0 else returncode,
            signal=signal_name(-returncode) if returncode < 0 else None,
            pid=child.pid,
            start_ticks=child.start_ticks,
            started_at=started_at,
            ended_at=ended_at,
            max_rss_bytes=max_rss,
            stop_requested=self.stop.requested,
            signals_sent=list(self.signals_sent),
            log_bytes=os.fstat(log_fd).st_size,
        )

    def _record_spawn_error(self, log_fd: int, message: str, code: int | None) -> int:
        log.error("%s", message)
        self._write_exit(self._record_without_child(log_fd, message, code))
        return 0

    def _record_stopped_before_start(self, log_fd: int) -> int:
        """A stop that came before the child started: nothing is started, nothing is killed."""
        log.info("stop requested (%s) before the training process started", self.stop.cause)
        self._write_exit(self._record_without_child(log_fd, None, None))
        return 0

    def _record_without_child(self, log_fd: int, error: str | None, code: int | None) -> ExitRecord:
        return ExitRecord(
            returncode=None,
            exit_code=None,
            signal=None,
            pid=None,
            start_ticks=None,
            started_at=None,
            ended_at=time.time(),
            max_rss_bytes=None,
            stop_requested=self.stop.requested,
            spawn_error=error,
            spawn_errno=code,
            log_bytes=os.fstat(log_fd).st_size,
        )

    def _write_exit(self, record: ExitRecord) -> None:
        """The exit record, also on a disk the run filled: the room kept for it at the start
        (`_keep_room`) is given back, and the record written again (or was given back for
        the log's marker line just before, and has room for both)."""
        data = exit_record_to_json(record)
        try:
            atomic_write_json(self.files.exit, data)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not _give_back(self.files.exit_reserve):
                raise
            log.warning("the disk is full: the exit record goes where room was kept for it")
            atomic_write_json(self.files.exit, data)
        _give_back(self.files.exit_reserve)
        self._notify()

    def _notify(self) -> None:
        """SIGUSR1 to the process that asked for it (the server, which then runs its next
        pass at once), if it is still that process (pid and start time, never a pid alone):
        once the child has started (status.json written) and once it has ended (the exit
        record written). Signals that arrive during a pass make one more pass, not one each."""
        if self.spec.notify is None:
            return
        pid, ticks = self.spec.notify
        if send_signal(ProcessIdentity(pid, ticks), signal.SIGUSR1):
            return
        log.info("the process to notify (pid %d) is gone; it will find this replica's files",
                 pid)


def _sync_log(log_fd: int) -> str | None:
    """fdatasync the log; None, or why it failed (a file system that allocates late finds
    no room for the last bytes only now: they are lost)."""
    try:
        os.fdatasync(log_fd)
    except OSError as exc:
        log.error("cannot sync the training log to disk (%s): its last bytes may be lost", exc)
        return f"the log could not be synced to disk: {exc.strerror or exc}"
    return None


def _with_log(record: ExitRecord, pump: LogPump | None, spec: ReplicaSpec,
              sync_error: str | None) -> ExitRecord:
    """The record with the output the log lost (a full disk) or dropped (its limit)."""
    if pump is None:
        return dataclasses.replace(record, log_lost_error=sync_error)
    return dataclasses.replace(
        record, log_lost_bytes=pump.lost_bytes, log_lost_error=pump.lost_error or sync_error,
        log_dropped_bytes=pump.dropped_bytes, log_limit_bytes=spec.log_limit)


def _with_memory(record: ExitRecord, memory: MemoryReport | None) -> ExitRecord:
    """The record with the group's peak memory and any OOM kill, and how it fared against
    its memory limit if it had one (those fields stay empty without one, as before)."""
    if memory is None:
        return record
    oom = (None if memory.oom is None
           else OomKill(memory.oom, memory.limit_bytes, machine_memory()))
    record = dataclasses.replace(record, oom=oom, peak_rss_bytes=memory.peak_bytes)
    if memory.limit_bytes is None:
        return record
    return dataclasses.replace(
        record,
        memory_limit_bytes=memory.limit_bytes,
        peak_memory_bytes=memory.peak_bytes,
        memory_enforcement=memory.mechanism,
        memory_error=memory.error,
    )


def load_spec(path: Path) -> ReplicaSpec:
    """The replica's spec. A shim running as root takes only a spec root wrote: under
    `run_as` the job owns the attempt's directory, and a spec of its own making (one without
    the account, say) must not start anything as root."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        raise SystemExit(f"muster shim: no replica spec at {path}") from None
    with os.fdopen(fd, "rb") as file:
        if os.geteuid() == 0 and os.fstat(file.fileno()).st_uid != 0:
            raise SystemExit(f"muster shim: the replica spec {path} is not root's; refusing it")
        data = json.loads(file.read())
    if not isinstance(data, dict):
        raise SystemExit(f"muster shim: no replica spec at {path}")
    return spec_from_json(cast(ReplicaSpecJson, data))  # its reader converts each field


EXIT_RESERVE_BYTES = 64 << 10  # room for an exit record (its log tail included), and more


def _keep_room(path: Path) -> None:
    """Hold `EXIT_RESERVE_BYTES` of the run's file system for the log's last marker line and
    the exit record, written last: a run that fills its disk still ends with its exit status
    known, and its log says what it lost. Without the room (the
    disk is full already) the shim runs on; a record that cannot be written is LOST."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, EXIT_RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("no room kept for the exit record (%s): a full disk may lose it", exc)


def _give_back(path: Path) -> bool:
    """Remove the room kept for the exit record; True when there was some."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True



def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m muster.launch.shim SPEC_JSON_PATH`."""
    stop = StopFlag()
    install_signal_handlers(stop)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s shim[%(process)d] %(levelname)s %(message)s",
    )
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        log.error("usage: python -m muster.launch.shim SPEC_JSON_PATH")
        return 2
    return Shim(load_spec(Path(args[0])), stop).run()


if __name__ == "__main__":
    sys.exit(main())

