"""Logs that say when they are incomplete, and a cap (issue 31, item 6): the marker line for
output a full disk lost, and `resources.log_limit`'s head, marker and rolling tail, written
by real pumps and shims into real files and read back through every reader."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import mmap
import os
import re
import shutil
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from muster.launch.base import ReplicaSpec
from muster.launch.local import LocalLauncher
from muster.launch.log_limit import (
    MIN_LOG_LIMIT,
    CapPlan,
    DropStep,
    DropWorker,
    LogCap,
    LogDrops,
    dropped_marker,
    marker_bytes,
    read_drops,
)
from muster.launch.log_lines import LineStartsBackward, lines_from
from muster.launch.logs import FileLog, read_range, tail_offset, tail_text
from muster.launch.shim import LogPump
from muster.rundir import RankFiles
from muster.sizes import format_size
from muster.supervise.log_errors import scan_log as scan_errors
from muster.supervise.log_metrics import ScanSpec
from muster.supervise.log_metrics import scan_log as scan_metrics
from tests.launch.conftest import Replica, fixture_argv, kill_leftovers
from tests.waiting import wait_until

LIMIT = MIN_LOG_LIMIT
LINE = re.compile(rb"step (\d+): loss 0\.5\n")


# -- the plan and the record ---------------------------------------------------------------


@pytest.mark.parametrize("limit", [LIMIT, LIMIT + 12_345, 10 << 30, 3 << 40])
@pytest.mark.parametrize("block", [512, 4096, 1 << 20])
def test_a_cap_plan_fits_its_limit(limit: int, block: int) -> None:
    plan = CapPlan.of(limit, block)
    assert plan.head + plan.marker + plan.tail + plan.step + 2 * plan.block <= limit
    assert plan.step <= plan.tail < plan.head
    assert plan.head > limit * 0.4 and plan.tail > limit * 0.35
    assert plan.marker == marker_bytes(limit) == len(dropped_marker(limit * 7, limit))


def test_a_limit_under_one_mib_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1MiB"):
        CapPlan.of(LIMIT - 1, 4096)


def test_the_marker_says_how_much_was_dropped_on_a_line_of_its_own() -> None:
    line = dropped_marker(int(1.2 * 2**30), 10 << 30)
    assert line.startswith(b"\n") and line.endswith(b"\n") and line.count(b"\n") == 2
    assert line.decode().strip() == (
        "── muster: 1.2 GiB of output dropped here: the log reached resources.log_limit "
        "(10 GiB); the latest output follows ──")


DROPS = LogDrops(limit=LIMIT, ranges=((100, 200), (300, 400)), dropped=200)


@pytest.mark.parametrize(("start", "end", "spans"), [
    (0, 500, [(0, 100), (200, 300), (400, 500)]),
    (150, 350, [(200, 300)]),
    (200, 300, [(200, 300)]),
    (120, 180, []),
    (450, 460, [(450, 460)]),
])
def test_kept_stretches_skip_dropped_ranges(start: int, end: int,
                                            spans: list[tuple[int, int]]) -> None:
    assert DROPS.spans(start, end) == spans


def test_a_drop_record_answers_where_reads_go() -> None:
    assert [DROPS.skip(o) for o in (99, 100, 199, 200)] == [99, 200, 200, 200]
    assert [DROPS.room(o) for o in (0, 150, 250, 450)] == [100, 150, 50, None]
    assert [DROPS.back(e) for e in (100, 150, 200, 201, 400)] == [100, 100, 100, 201, 300]
    assert [DROPS.floor(e) for e in (50, 200, 350, 500)] == [0, 200, 200, 400]
    assert DROPS.dropped_within(350) == 150


@pytest.mark.parametrize("junk", [
    b"not json", b"[]", b'{"limit": 1, "ranges": [[5, 3]], "dropped_bytes": 0}',
    b'{"limit": 1, "ranges": [[0, 9], [5, 20]], "dropped_bytes": 0}',
    b'{"limit": -1, "ranges": [], "dropped_bytes": 0}',
])
def test_a_record_that_is_not_the_shims_reads_as_none(tmp_path: Path, junk: bytes) -> None:
    """A job owns its attempt's directory under run_as: a record it wrote must not make
    readers skip what they should show (the log then shows as stored)."""
    path = tmp_path / "rank-0.log.dropped"
    path.write_bytes(junk)
    assert read_drops(path) == (junk, None)
    assert FileLog(0, tmp_path / "rank-0.log").drops().ranges == ()


def test_a_record_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log.dropped"
    record = dataclasses.replace(DROPS, marker=40, hole_start=100)
    path.write_text(json.dumps(record.to_json()))
    assert read_drops(path)[1] == record


def test_a_tail_that_spans_a_dropped_range_is_read_around_it(tmp_path: Path) -> None:
    """Lines longer than what the tail kept: the last lines start before the dropped range,
    and are shown without it (a dropped range ends the line before it)."""
    log = tmp_path / "rank-0.log"
    head, hidden, tail = b"first\nmarker line\n", b"\0" * 5000, b"x" * 300 + b"\nlast\n"
    log.write_bytes(head + hidden + tail)
    (tmp_path / "rank-0.log.dropped").write_text(json.dumps(
        LogDrops(LIMIT, ((len(head), len(head) + len(hidden)),), len(hidden)).to_json()))
    assert tail_text(FileLog(0, log), 3) == (b"marker line\n" + tail).decode()
    assert tail_text(FileLog(0, log), 9) == (head + tail).decode()


# -- a pump past its limit -----------------------------------------------------------------


@dataclasses.dataclass
class PumpedLog:
    files: RankFiles
    written: int  # bytes fed into the pump

    @property
    def log(self) -> FileLog:
        return FileLog(0, self.files.log, self.files.index, self.files.dropped)

    def allocated(self) -> int:
        return os.stat(self.files.log).st_blocks * 512

    def read_all(self) -> bytes:
        """The log as its readers show it, paged with read_range as a follower pages it."""
        data, offset = [], 0
        while chunk_and_next := read_range(self.log, offset, 65536):
            chunk, offset = chunk_and_next
            if not chunk:
                break
            data.append(chunk)
        return b"".join(data)


def _steps(first: int, count: int) -> bytes:
    return b"".join(b"step %d: loss 0.5\n" % n for n in range(first, first + count))


def _pump(files: RankFiles, payload: bytes, limit: int = LIMIT,
          cap: type[LogCap] = LogCap) -> PumpedLog:
    """Feed `payload` through a real pipe into a pump held to `limit` until EOF."""
    files.attempt_dir.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    log_fd = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    index_fd = os.open(files.index, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pump = LogPump(read_fd, log_fd, index_fd, cap(limit, log_fd, files.dropped))

    def write() -> None:
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view[:50_000]):]
        os.close(write_fd)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while not pump.eof:
            pump.pump_once(100)
        pump.finish()
    finally:
        writer.join(timeout=30)
        for fd in (read_fd, log_fd, index_fd):
            os.close(fd)
    assert not writer.is_alive(), "the writer is stuck: the pump stopped reading the pipe"
    assert pump.lost_bytes == 0
    return PumpedLog(files, len(payload))


def _check_head_marker_tail(shown: bytes, lines: int) -> int:
    """The log as shown holds step 0 on, the marker line, then the last steps up to the
    final one, each stretch unbroken; returns how many steps the tail kept."""
    assert b"\0" not in shown
    head, marker, tail = re.split("\n(── muster: [^\n]*)\n".encode(), shown)
    assert re.fullmatch("── muster: .+ of output dropped here: the log reached "
                        r"resources\.log_limit \(1 MiB\); the latest output follows ── *"
                        .encode(), marker)
    head_steps = [int(m) for m in re.findall(rb"step (\d+): ", head)]
    assert head_steps == list(range(len(head_steps))) and head_steps
    tail_lines = tail.split(b"\n", 1)[1]  # the first is what was left of a line
    tail_steps = [int(m) for m in re.findall(rb"step (\d+): ", tail_lines)]
    assert tail_steps == list(range(lines - len(tail_steps), lines)) and tail_steps
    return len(tail_steps)


def test_a_log_past_its_limit_keeps_its_head_and_its_latest_output(tmp_path: Path) -> None:
    """Three times its limit: the head, the marker (with the count of what was dropped) and
    the tail are shown, no NUL byte; the file's allocated size stays within the limit while
    its size (every offset) is that of all the output."""
    payload = _steps(0, 150_000)  # about 3 MiB
    pumped = _pump(RankFiles(tmp_path, 0), payload)
    assert os.path.getsize(pumped.files.log) == len(payload) + marker_bytes(LIMIT)
    assert pumped.allocated() <= LIMIT
    shown = pumped.read_all()
    kept = _check_head_marker_tail(shown, 150_000)
    assert kept * 20 > CapPlan.of(LIMIT, 4096).tail * 0.9
    record = read_drops(pumped.files.dropped)[1]
    assert record is not None and record.dropped == len(payload) + marker_bytes(LIMIT) - len(
        shown)
    count = re.search(rb"muster: (\S+ \S+) of output dropped", shown)
    assert count is not None and count[1] == format_size(record.dropped).encode()
    offsets = [int(line.split()[0]) for line in pumped.files.index.read_text().splitlines()]
    assert offsets == sorted(set(offsets)), "the index stays in order"


def test_readers_never_show_a_dropped_byte_while_the_log_rolls(tmp_path: Path) -> None:
    """Followers paging from the start and tail readers, on a thread of their own, reading
    while the pump punches older output out: none ever sees a NUL (the record is written
    before each punch and read again after each read)."""
    files = RankFiles(tmp_path, 0)
    files.attempt_dir.mkdir(parents=True, exist_ok=True)
    files.log.touch()
    seen: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            offset, log = 0, FileLog(0, files.log)
            while data_next := read_range(log, offset, 4096):
                data, offset = data_next
                if not data:
                    break
                seen.append(data)
            seen.append(tail_text(log, 50).encode())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _pump(files, _steps(0, 300_000))
    finally:
        done.set()
        reader.join(timeout=30)
    assert len(seen) > 1000
    assert not any(b"\0" in chunk for chunk in seen)


def _holes(fd: int) -> list[tuple[int, int]]:
    """The holes in the file at `fd` as its file system reports them (SEEK_HOLE/SEEK_DATA),
    less the one every file has at its end."""
    holes, at = [], 0
    while True:
        try:
            start = os.lseek(fd, at, os.SEEK_HOLE)
            end = os.lseek(fd, start, os.SEEK_DATA)
        except OSError as exc:  # ENXIO: at the end, or no data after the hole (the end's)
            assert exc.errno == errno.ENXIO, exc
            return holes
        if end == start:  # the end's hole, and the file grew meanwhile
            return holes
        holes.append((start, end))
        at = end


def _recorded(record: LogDrops | None, hole: tuple[int, int]) -> bool:
    return record is not None and any(start <= hole[0] and hole[1] <= end
                                       for start, end in record.ranges)


def test_the_record_on_disk_names_every_hole_at_every_moment(tmp_path: Path) -> None:
    """A thread looks at the log's holes as the file system reports them while a pump rolls
    it at ten times its limit, then at the record: every hole it saw lies in a range the
    record names (a range is punched only once the record that names it is written, so a
    reader that reads the record after its read never shows a punched byte)."""
    files = RankFiles(tmp_path, 0)
    files.attempt_dir.mkdir(parents=True, exist_ok=True)
    files.log.touch()
    looks, unrecorded, seen = 0, [], set()
    done = threading.Event()

    def watch() -> None:
        nonlocal looks
        fd = os.open(files.log, os.O_RDONLY)
        try:
            while not done.is_set():
                holes = _holes(fd)
                record = read_drops(files.dropped)[1]
                looks += 1
                seen.update(holes)
                unrecorded.extend((h, record) for h in holes if not _recorded(record, h))
        finally:
            os.close(fd)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        pumped = _pump(files, _steps(0, 500_000))  # about 10 MiB
    finally:
        done.set()
        watcher.join(timeout=30)
    assert not unrecorded, unrecorded[:3]
    assert looks > 10 and len({end for _, end in seen}) > 3, "the hole was seen growing"
    assert pumped.allocated() <= LIMIT


# /proc/kpageflags (Documentation/admin-guide/mm/pagemap.rst): written and not yet on disk,
# or on its way there (ext4 starts the writeback of a file renamed over another at once).
_KPF_DIRTY, _KPF_WRITEBACK = 1 << 4, 1 << 8


def _dirty_pages(path: Path) -> int | None:
    """How many of the file's pages in the page cache are not on disk yet (dirty, or under
    writeback), read through /proc/self/pagemap and /proc/kpageflags; None where those do
    not tell (not root: page frame numbers read as 0, or no /proc/kpageflags)."""
    if not os.access("/proc/kpageflags", os.R_OK):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page, fd = mmap.PAGESIZE, os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    dirty = 0
    try:
        with open("/proc/self/pagemap", "rb") as pagemap, \
                open("/proc/kpageflags", "rb") as kpageflags:
            for at in range(address, address + size, page):
                ctypes.c_char.from_address(at).value  # noqa: B018  (fault the page in)
                pagemap.seek(at // page * 8)
                frame = struct.unpack("Q", pagemap.read(8))[0] & ((1 << 55) - 1)
                if frame == 0:
                    return None
                kpageflags.seek(frame * 8)
                flags = struct.unpack("Q", kpageflags.read(8))[0]
                dirty += bool(flags & (_KPF_DIRTY | _KPF_WRITEBACK))
    finally:
        libc.munmap(address, size)
    return dirty


class _CheckedWorker(DropWorker):
    """Looks at the record that stands under its name at the moment of each punch (does it
    name the range about to be punched? is it on disk?) and after each step."""

    punches: ClassVar[list[tuple[tuple[int, int], bool, int | None]]] = []
    steps: ClassVar[list[int | None]] = []  # the record's pages not on disk after each step

    def carry_out(self, step: DropStep) -> None:
        super().carry_out(step)
        self.steps.append(_dirty_pages(self._record))

    def _punch_out(self, punch: tuple[int, int]) -> None:
        range_ = (max(punch[0], self._punched_to), punch[1])
        if range_[1] > range_[0]:
            named = _recorded(read_drops(self._record)[1], range_)
            self.punches.append((range_, named, _dirty_pages(self._record)))
        super()._punch_out(punch)


class _CheckedCap(LogCap):
    worker_class = _CheckedWorker


def test_each_range_is_punched_only_once_a_synced_record_names_it(tmp_path: Path) -> None:
    """Invariant 6 for the record: at each punch the record under its name already names
    the range, and none of its pages waits in the page cache (the kernel's own page flags:
    it was synced before it was renamed there); nor after any step, the first (a record
    with no range yet, where no earlier one stood) and the last included. The first record
    written without a sync, as the shim once wrote them while the child ran, stays dirty
    for half a minute."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"written, not synced")
    if _dirty_pages(probe) != 1:
        pytest.skip("the page cache's dirty flags need /proc/kpageflags (root)")
    _CheckedWorker.punches, _CheckedWorker.steps = [], []
    _pump(RankFiles(tmp_path / "attempt", 0), _steps(0, 150_000), cap=_CheckedCap)
    punches = _CheckedWorker.punches
    assert len(punches) > 3 and all(named and not dirty for _, named, dirty in punches), punches
    assert len(_CheckedWorker.steps) > len(punches) and not any(_CheckedWorker.steps)


def test_line_readers_tails_and_scans_go_around_the_dropped_range(tmp_path: Path) -> None:
    """Forward and backward line readers agree on where lines start (the bytes after the
    range start a line); a tail is the latest output; metrics read from the log reach the
    last step, and a traceback at the end is found."""
    payload = _steps(0, 150_000) + b"Traceback (most recent call last):\nValueError: bad\n"
    pumped = _pump(RankFiles(tmp_path, 0), payload)
    log = pumped.log
    lines = list(lines_from(log, 0, final=True))
    assert b"".join(line.data for line in lines) == pumped.read_all()
    backward = LineStartsBackward(log, final=True)
    try:
        starts = list(backward)
    finally:
        backward.close()
    assert starts == [line.offset for line in reversed(lines)]
    assert read_range(log, tail_offset(log, 2), 1000)[0] == payload.splitlines(True)[-2] + \
        payload.splitlines(True)[-1]
    metrics = scan_metrics(log, ScanSpec(final=True))
    assert metrics.problem is None and metrics.highest["training"] == 149_999
    assert metrics.end.offset == os.path.getsize(pumped.files.log)
    assert [f.text for f in scan_errors(log).findings][-1:] == ["ValueError: bad"]


@contextlib.contextmanager
def _append_only(path: Path) -> Iterator[None]:
    """`path` append-only (chattr +a), which refuses hole punching; skips where it cannot be."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr here")
    path.touch()
    if subprocess.run([chattr, "+a", str(path)], capture_output=True, check=False).returncode:
        pytest.skip(f"cannot make {path} append-only here (needs root and a file system "
                    "with the attribute)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-a", str(path)], check=True)


def test_where_holes_cannot_be_punched_the_latest_output_comes_at_the_end(
        tmp_path: Path) -> None:
    """An append-only log cannot have holes punched: the head and its marker, then nothing
    while the output goes on (it is held in memory), then a count line and the latest
    output at the end; the file stays within the limit."""
    files = RankFiles(tmp_path, 0)
    with _append_only(files.log):
        pumped = _pump(files, _steps(0, 150_000))
    shown = files.log.read_bytes()
    assert pumped.read_all() == shown and b"\0" not in shown
    head, held, between, count, tail = re.split("\n?── muster: ([^\n]*) ──\n".encode(), shown)
    assert between == b"" and head.startswith(b"step 0: loss 0.5\n")
    assert b"from here on output is held in memory" in held
    assert re.fullmatch(rb".+ of output dropped here: the log reached resources\.log_limit "
                        rb"\(1 MiB\); the latest .+ follow", count)
    tail_steps = [int(m) for m in re.findall(rb"step (\d+): ", tail.split(b"\n", 1)[1])]
    assert tail_steps[-1] == 149_999 and tail_steps == list(range(tail_steps[0], 150_000))
    assert len(shown) <= LIMIT


# -- real shims ----------------------------------------------------------------------------


def _submit_with_limit(launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec],
                       limit: int | None, name: str, *args: str) -> Replica:
    spec = dataclasses.replace(make_spec(fixture_argv(name, *args)), log_limit=limit)
    launcher.submit(spec)
    return Replica(launcher, spec)


@pytest.mark.lifecycle
def test_a_replica_printing_three_times_its_limit_finishes_with_head_and_tail(
        launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec], tmp_path: Path) -> None:
    """The training process is never held up by the limit: it finishes; its exit record
    counts what was dropped; the log shows its first and last lines around the marker."""
    try:
        replica = _submit_with_limit(launcher, make_spec, LIMIT, "numbered_lines.py",
                                     str(3 * LIMIT))
        record = replica.wait_exit()
    finally:
        kill_leftovers(tmp_path)
    assert record.returncode == 0 and record.log_limit_bytes == LIMIT
    shown = replica.log()
    assert shown.startswith(b"line 000000000000\n") and shown.endswith(b"done\n")
    assert b"\0" not in shown and record.log_lost_bytes == 0
    assert record.log_dropped_bytes == record.log_bytes - len(shown)
    assert os.stat(replica.files.log).st_blocks * 512 <= LIMIT
    assert b"of output dropped here: the log reached resources.log_limit (1 MiB)" in shown


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 2 MiB tmpfs: a real file system a test can fill under a running replica."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs",
                               str(mount_point)], capture_output=True, text=True, check=False)
    except OSError as exc:
        pytest.skip(f"no mount command to make a small disk to fill: {exc}")
    if done.returncode != 0:
        pytest.skip("cannot mount a 2 MiB tmpfs to fill (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        kill_leftovers(mount_point)
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def fill(path: Path) -> None:
    """Write `path` until its file system is full (ENOSPC)."""
    with path.open("ab", buffering=0) as file, contextlib.suppress(OSError):
        while True:
            file.write(b"\0" * 4096)


def filled_disk_run(launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec],
                    disk: Path, control: Path) -> Replica:
    """Run print_in_phases.py with its attempt on `disk`, filled while it prints 200 KiB and
    emptied before it prints "after"; returns it once it has exited."""
    spec = dataclasses.replace(make_spec(fixture_argv("print_in_phases.py", str(control),
                                                      str(200 * 1024))),
                               attempt_dir=disk / "attempt-1", cwd=disk)
    launcher.submit(spec)
    replica = Replica(launcher, spec)
    replica.wait_log(b"before\n")
    fill(disk / "filler")
    (control / "go").touch()
    wait_until(lambda: (control / "printed").exists(), timeout=60,
               what="the child to print while the disk is full (it must never block)")
    (disk / "filler").unlink()
    (control / "more").touch()
    replica.wait_exit()
    return replica


@pytest.mark.lifecycle
def test_output_lost_on_a_full_disk_is_marked_in_the_log_and_counted(
        launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec], small_disk: Path,
        tmp_path: Path) -> None:
    """A disk filled under a running replica: the child goes on printing (the pump keeps
    draining); once the disk has room again a marker line says how much was lost and why,
    where it was lost; the exit record counts it."""
    control = tmp_path / "control"
    control.mkdir()
    replica = filled_disk_run(launcher, make_spec, small_disk, control)
    record = replica.describe().exit
    assert record is not None and record.returncode == 0
    assert record.log_lost_bytes > 0 and record.log_lost_error == "No space left on device"
    shown = replica.log()
    marker = re.search("\n── muster: (.+) of output lost here: No space left on device ──\n"
                       .encode(), shown)
    assert marker is not None, shown[-300:]
    assert shown.startswith(b"before\n") and shown.endswith(b"after\n")
    assert shown.index(marker[0]) < shown.index(b"after\n")


def test_a_punch_refused_midway_keeps_the_latest_output_in_memory(tmp_path: Path) -> None:
    """Holes could be punched when the head ended, but not later (here the log turns
    append-only): the output from then on is held in memory and written at the end after a
    count line; nothing shown is a NUL, and the last step is there."""
    files = RankFiles(tmp_path, 0)
    files.attempt_dir.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    log_fd = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    index_fd = os.open(files.index, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pump = LogPump(read_fd, log_fd, index_fd, LogCap(LIMIT, log_fd, files.dropped))
    first, rest = _steps(0, 35_000), _steps(35_000, 115_000)  # past the head; then 2+ MiB

    def drain_while(payload: bytes) -> None:
        writer = threading.Thread(target=os.write, args=(write_fd, payload), daemon=True)
        writer.start()
        while writer.is_alive() or pump.pump_once(0):
            pump.pump_once(10)

    try:
        drain_while(first)
        with _append_only(files.log):
            for start in range(0, len(rest), 60_000):
                drain_while(rest[start:start + 60_000])
            os.close(write_fd)
            while not pump.eof:
                pump.pump_once(100)
            pump.finish()
    finally:
        for fd in (read_fd, log_fd, index_fd):
            os.close(fd)
    shown = PumpedLog(files, 0).read_all()
    assert b"\0" not in shown and pump.lost_bytes == 0
    assert shown.startswith(b"step 0: loss 0.5\n") and shown.endswith(b"step 149999: loss 0.5\n")
    assert b"the latest output follows" in shown
    count_line = re.search("── muster: (.+) of output dropped here: the log reached "
                           r"resources\.log_limit \(1 MiB\); the latest (.+) follow ──\n"
                           .encode(), shown)
    assert count_line is not None


def test_a_restart_in_place_goes_on_from_the_log_s_record(tmp_path: Path) -> None:
    """The next incarnation of a replica appends to the same log: its pump takes up the
    earlier one's hole and marker (one marker, one dropped range), and the log stays
    within its limit, its latest output the new incarnation's."""
    files = RankFiles(tmp_path, 0)
    _pump(files, _steps(0, 100_000))
    first = read_drops(files.dropped)[1]
    pumped = _pump(files, _steps(100_000, 100_000))
    second = read_drops(files.dropped)[1]
    assert first is not None and second is not None
    assert (second.marker, second.hole_start) == (first.marker, first.hole_start)
    assert len(second.ranges) == 1 and second.ranges[0][1] > first.ranges[0][1]
    assert pumped.allocated() <= LIMIT
    _check_head_marker_tail(pumped.read_all(), 200_000)
