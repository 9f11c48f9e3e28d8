"""The shim's file formats and entry point (its lifecycle is covered in test_local.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.atomic import atomic_write_json
from muster.launch.base import ExitRecord, ProcessIdentity, ReplicaSpec
from muster.launch.identity import own_identity
from muster.launch.local import LocalLauncher
from muster.launch.records import exit_record_from_json, spec_from_json, spec_to_json
from muster.launch.shim import LogPump, load_spec, signal_name
from muster.rundir import RankFiles
from muster.states import ReplicaPhase

pytestmark = pytest.mark.lifecycle  # starts real processes

def test_a_spec_survives_a_json_round_trip(tmp_path: Path) -> None:
    spec = ReplicaSpec(
        trial_uuid="t-1",
        attempt=2,
        rank=3,
        argv=["python", "train.py", "--lr", "0.1"],
        env={"PATH": "/usr/bin", "MUSTER_RUN_DIR": "/runs/1"},
        cwd=tmp_path,
        attempt_dir=tmp_path / "attempt-2",
        stop_grace=1.5,
    )
    assert spec_from_json(json.loads(json.dumps(spec_to_json(spec)))) == spec


def test_an_exit_record_parses_and_ignores_unknown_keys() -> None:
    record = ExitRecord(
        returncode=-9,
        exit_code=137,
        signal="SIGKILL",
        pid=10,
        start_ticks=20,
        started_at=1.0,
        ended_at=2.0,
        max_rss_bytes=4096,
        stop_requested=True,
        signals_sent=["SIGTERM", "SIGKILL"],
        log_bytes=12,
    )
    data = dataclasses.asdict(record) | {"added_by_a_newer_shim": 1}
    assert exit_record_from_json(json.loads(json.dumps(data))) == record


@pytest.mark.parametrize(
    ("signum", "name"), [(9, "SIGKILL"), (11, "SIGSEGV"), (6, "SIGABRT"), (40, "SIG40")]
)
def test_signal_name(signum: int, name: str) -> None:
    assert signal_name(signum) == name


def test_replica_files_are_named_by_rank(tmp_path: Path) -> None:
    files = RankFiles(tmp_path, 2)
    names = [files.log, files.index, files.spec, files.launch, files.status, files.exit]
    assert [p.name for p in names] == [
        "rank-2.log",
        "rank-2.index",
        "rank-2.spec.json",
        "rank-2.launch.json",
        "rank-2.shim.json",
        "rank-2.exit.json",
    ]
    assert (files.shim_log.name, files.stop.name) == ("rank-2.shim.log", "rank-2.stop")


def test_the_shim_explains_its_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "muster.launch.shim"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "usage: python -m muster.launch.shim SPEC_JSON_PATH" in result.stderr


def _write_launch(files: RankFiles, shim: ProcessIdentity, launched_at: float) -> None:
    files.attempt_dir.mkdir(exist_ok=True)
    launch = {
        "shim_pid": shim.pid,
        "shim_start_ticks": shim.start_ticks,
        "launched_at": launched_at,
    }
    atomic_write_json(files.launch, launch)


def test_a_live_shim_without_a_child_yet_is_starting(tmp_path: Path) -> None:
    files = RankFiles(tmp_path / "attempt-1", 0)
    _write_launch(files, own_identity(), time.time())
    assert LocalLauncher().describe(files.attempt_dir, 0).phase is ReplicaPhase.STARTING


def test_a_shim_that_never_started_its_child_is_lost(tmp_path: Path) -> None:
    files = RankFiles(tmp_path / "attempt-1", 0)
    _write_launch(files, own_identity(), time.time() - LocalLauncher.STARTUP_WINDOW_S - 1)
    assert LocalLauncher().describe(files.attempt_dir, 0).phase is ReplicaPhase.LOST


def test_recorded_processes_that_are_gone_are_lost(tmp_path: Path) -> None:
    me = own_identity()
    stale = ProcessIdentity(me.pid, me.start_ticks + 1)  # this pid, but another process
    files = RankFiles(tmp_path / "attempt-1", 0)
    _write_launch(files, stale, time.time())
    status = {
        "shim_pid": stale.pid,
        "shim_start_ticks": stale.start_ticks,
        "child_pid": stale.pid,
        "child_start_ticks": stale.start_ticks,
        "pgid": stale.pid,
        "started_at": time.time(),
    }
    atomic_write_json(files.status, status)
    described = LocalLauncher().describe(files.attempt_dir, 0)
    assert described.phase is ReplicaPhase.LOST
    assert described.shim == stale and described.child == stale


def test_nothing_at_all_is_lost(tmp_path: Path) -> None:
    described = LocalLauncher().describe(tmp_path / "attempt-9", 0)
    assert described.phase is ReplicaPhase.LOST and described.shim is None


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):  # the test may have closed it already
            os.close(fd)


def _open(path: Path | str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def test_the_pump_copies_chunks_and_indexes_them(tmp_path: Path, pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    log_fd, index_fd = _open(tmp_path / "rank-0.log"), _open(tmp_path / "rank-0.index")
    pump = LogPump(read_fd, log_fd, index_fd)
    for chunk in (b"first\n", b"\xff second"):
        os.write(write_fd, chunk)
        assert pump.pump_once(1000) == len(chunk)
    os.close(write_fd)
    assert pump.drain(silence_s=60, limit_s=60)
    os.close(log_fd)
    os.close(index_fd)
    assert (tmp_path / "rank-0.log").read_bytes() == b"first\n\xff second"
    offsets = [line.split()[0] for line in (tmp_path / "rank-0.index").read_text().splitlines()]
    assert offsets == ["0", "6"]


def test_a_full_disk_drops_output_but_keeps_draining(tmp_path: Path, pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    log_fd, index_fd = _open("/dev/full"), _open(tmp_path / "rank-0.index")
    pump = LogPump(read_fd, log_fd, index_fd)
    os.write(write_fd, b"lost line\n")
    assert pump.pump_once(1000) == 10
    os.close(log_fd)
    os.close(index_fd)
    assert pump.lost_bytes == 10
    assert (tmp_path / "rank-0.index").read_text() == ""


def test_a_full_disk_for_the_index_keeps_the_log(tmp_path: Path, pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    log_fd, index_fd = _open(tmp_path / "rank-0.log"), _open("/dev/full")
    pump = LogPump(read_fd, log_fd, index_fd)
    os.write(write_fd, b"kept line\n")
    assert pump.pump_once(1000) == 10
    os.close(log_fd)
    os.close(index_fd)
    assert pump.lost_bytes == 0 and pump.offset == 10
    assert (tmp_path / "rank-0.log").read_bytes() == b"kept line\n"


def test_drain_gives_up_on_a_silent_pipe_held_open(tmp_path: Path, pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    log_fd, index_fd = _open(tmp_path / "rank-0.log"), _open(tmp_path / "rank-0.index")
    pump = LogPump(read_fd, log_fd, index_fd)
    os.write(write_fd, b"before\n")
    assert not pump.drain(silence_s=0.3, limit_s=60)
    os.close(log_fd)
    os.close(index_fd)
    assert (tmp_path / "rank-0.log").read_bytes() == b"before\n"


def _odd_bytes(size: int) -> bytes:
    """`size` bytes no text codec passes through untouched: every byte value, NULs, invalid
    UTF-8, CRs, and no newline at the end."""
    body = random.Random(size).randbytes(size - 4)
    return body + b"\x00\xff\r!"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _feed(write_fd: int, data: bytes) -> threading.Thread:
    """Write `data` into the pipe in writes of uneven sizes from a thread (it is larger than
    the pipe, so the pump must drain it meanwhile), then close the pipe."""

    def write() -> None:
        view, sizes, turn = memoryview(data), [1, 100, 4097, 65536, 333_333], 0
        while view:
            view = view[os.write(write_fd, view[: sizes[turn % len(sizes)]]) :]
            turn += 1
        os.close(write_fd)

    thread = threading.Thread(target=write, daemon=True)  # a stuck pump must not hang pytest
    thread.start()
    return thread


def test_the_pump_copies_byte_exactly(tmp_path: Path, pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    log_path = tmp_path / "rank-0.log"
    log_fd, index_fd = _open(log_path), _open(tmp_path / "rank-0.index")
    payload = _odd_bytes(3 * 1024 * 1024 + 12_345)  # many chunks, none aligned to a page
    pump = LogPump(read_fd, log_fd, index_fd)
    writer = _feed(write_fd, payload)
    assert pump.drain(silence_s=10, limit_s=60)
    writer.join(timeout=30)
    assert not writer.is_alive(), "the writer is stuck: the pump stopped reading the pipe"
    os.close(log_fd)
    os.close(index_fd)
    assert _sha256(log_path.read_bytes()) == _sha256(payload)
    assert pump.offset == len(payload) and pump.lost_bytes == 0
    index = (tmp_path / "rank-0.index").read_text()
    offsets = [int(line.split()[0]) for line in index.splitlines()]
    assert offsets[0] == 0 and offsets == sorted(set(offsets)) and offsets[-1] < len(payload)


def _refuse_splice(log_fd: int) -> None:
    """Make the kernel refuse splice(2) into the log from now on (EINVAL: it refuses a file
    open for appending), as a file system without splice would."""
    fcntl.fcntl(log_fd, fcntl.F_SETFL, fcntl.fcntl(log_fd, fcntl.F_GETFL) | os.O_APPEND)


@pytest.mark.skipif(os.geteuid() != 0, reason="the pump splices only as root (_open_stage)")
def test_a_log_that_refuses_splice_midway_loses_no_byte(
    tmp_path: Path, pipe: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """The pump splices into a log file; refused midway, it copies the chunk it holds and all
    later ones through its buffer, byte for byte and in order."""
    read_fd, write_fd = pipe
    log_path = tmp_path / "rank-0.log"
    log_fd, index_fd = _open(log_path), _open(tmp_path / "rank-0.index")
    pump = LogPump(read_fd, log_fd, index_fd)
    assert not fcntl.fcntl(log_fd, fcntl.F_GETFL) & os.O_APPEND  # the pump writes at its end
    os.write(write_fd, b"spliced\n")
    assert pump.pump_once(1000) == 8
    _refuse_splice(log_fd)
    payload = _odd_bytes(2 * 1024 * 1024 + 7)
    writer = _feed(write_fd, payload)
    with caplog.at_level(logging.INFO, logger="muster.shim"):
        assert pump.drain(silence_s=10, limit_s=60)
    writer.join(timeout=30)
    os.close(log_fd)
    os.close(index_fd)
    assert _sha256(log_path.read_bytes()) == _sha256(b"spliced\n" + payload)
    assert pump.offset == 8 + len(payload) and pump.lost_bytes == 0
    offsets = [int(line.split()[0]) for line in (tmp_path / "rank-0.index").read_text().split("\n")
               if line]
    assert offsets[:2] == [0, 8] and offsets == sorted(set(offsets))
    assert "the log refuses splice(2)" in caplog.text


_WRITE_ERROR_SCRIPT = textwrap.dedent(
    """
    import fcntl, json, os, resource, signal, sys
    from muster.launch.shim import LogPump

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    log_fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    index_fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    read_fd, write_fd = os.pipe()
    pump = LogPump(read_fd, log_fd, index_fd)
    if sys.argv[3] == "buffer":  # the kernel refuses splice into an O_APPEND file
        fcntl.fcntl(log_fd, fcntl.F_SETFL, fcntl.fcntl(log_fd, fcntl.F_GETFL) | os.O_APPEND)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
    for size in (40960, 40960, 10000):
        os.write(write_fd, bytes(range(256)) * (size // 256) + bytes(size % 256))
        while pump.pump_once(0):  # at the limit: a short write, then failing ones
            pass
    os.close(write_fd)
    done = pump.drain(silence_s=10, limit_s=30)
    print(json.dumps({"drained": done, "lost": pump.lost_bytes, "offset": pump.offset,
                      "pipe_empty": pump.eof}))
    """
)


@pytest.mark.parametrize("path", ["splice", "buffer"])
def test_a_failed_write_drops_its_bytes_and_keeps_draining(tmp_path: Path, path: str) -> None:
    """A log write that fails (here: past RLIMIT_FSIZE, as with a full disk) loses those
    bytes, but the pump keeps emptying the pipe, or the child would block; spliced or
    copied through the buffer alike."""
    log_path, index_path = tmp_path / "rank-0.log", tmp_path / "rank-0.index"
    result = subprocess.run(
        [sys.executable, "-c", _WRITE_ERROR_SCRIPT, str(log_path), str(index_path), path],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome = json.loads(result.stdout)
    sent = 40960 + 40960 + 10000
    assert outcome == {
        "drained": True,
        "lost": sent - 65536,
        "offset": 65536,
        "pipe_empty": True,
    }
    first = (bytes(range(256)) * 160) * 2
    assert _sha256(log_path.read_bytes()) == _sha256(first[:65536])
    assert "cannot write the training log" in result.stderr


def _run_shim(tmp_path: Path, files: RankFiles, payload: bytes) -> tuple[ExitRecord, str]:
    """Run a real shim whose child writes `payload`; its exit record and its diagnostics."""
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    copy = "import shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), sys.stdout.buffer)"
    spec = ReplicaSpec(
        trial_uuid="t-1",
        attempt=1,
        rank=0,
        argv=[sys.executable, "-c", copy, str(source)],
        env=dict(os.environ),
        cwd=tmp_path,
        attempt_dir=files.attempt_dir,
    )
    atomic_write_json(files.spec, spec_to_json(spec))
    assert load_spec(files.spec) == spec
    shim = subprocess.run(
        [sys.executable, "-P", "-m", "muster.launch.shim", str(files.spec)],
        cwd=files.attempt_dir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    diagnostics = shim.stderr.decode(errors="replace")
    assert shim.returncode == 0, diagnostics
    return exit_record_from_json(json.loads(files.exit.read_text())), diagnostics


def test_the_shim_adds_to_a_log_that_already_has_bytes(tmp_path: Path) -> None:
    """A log that exists when the shim starts (a resumed attempt) is added to, byte for byte,
    never overwritten; the index and the exit record count from its old end."""
    attempt_dir = tmp_path / "attempt-1"
    attempt_dir.mkdir()
    files = RankFiles(attempt_dir, 0)
    earlier = b"written before\x00\xfe\xff (no newline)"
    files.log.write_bytes(earlier)
    payload = _odd_bytes((9 << 20) + 4321)  # past the first early-writeback step
    record, diagnostics = _run_shim(tmp_path, files, payload)
    assert record.returncode == 0
    assert record.log_bytes == len(earlier) + len(payload)
    assert _sha256(files.log.read_bytes()) == _sha256(earlier + payload)
    first_offset = files.index.read_text().split(" ", 1)[0]
    assert int(first_offset) == len(earlier)
    assert "splice" not in diagnostics  # spliced, with no fallback


@contextlib.contextmanager
def _append_only(path: Path) -> Iterator[None]:
    """`path` with the append-only attribute (`chattr +a`) for the block; skips the test where
    it cannot be set (not root, or a file system without it)."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr here")
    if subprocess.run([chattr, "+a", str(path)], capture_output=True, check=False).returncode:
        pytest.skip(f"cannot make {path} append-only here")
    try:
        yield
    finally:
        subprocess.run([chattr, "-a", str(path)], check=True)


def test_an_append_only_log_is_copied_through_the_buffer(tmp_path: Path) -> None:
    """A log that may only be appended to (chattr +a) cannot take splice(2): the shim copies
    through its buffer instead, byte for byte, from the log's old end."""
    attempt_dir = tmp_path / "attempt-1"
    attempt_dir.mkdir()
    files = RankFiles(attempt_dir, 0)
    earlier = b"written before\n"
    files.log.write_bytes(earlier)
    payload = _odd_bytes((3 << 20) + 99)
    with _append_only(files.log):
        record, diagnostics = _run_shim(tmp_path, files, payload)
    assert record.returncode == 0 and record.log_bytes == len(earlier) + len(payload)
    assert _sha256(files.log.read_bytes()) == _sha256(earlier + payload)
    assert int(files.index.read_text().split(" ", 1)[0]) == len(earlier)
    assert "the log is copied through a buffer, not spliced" in diagnostics


def test_a_run_that_fills_its_disk_still_ends_with_its_exit_record(tmp_path: Path) -> None:
    """The child fills the attempt's file system (a 2 MiB tmpfs) and the disk stays full to
    its end: its output is cut, but in the room the shim kept from its start the log still
    ends with the marker line that says what was lost, and the exit record is written and
    counts it; none of that room is left behind."""
    if os.geteuid() != 0:
        pytest.skip("mounting the small file system needs root")
    from muster.launch.small_fs import mount_small_fs, release_small_fs

    attempt_dir = tmp_path / "attempt-1"
    mount_small_fs(attempt_dir, 2 << 20)
    try:
        files = RankFiles(attempt_dir, 0)
        record, diagnostics = _run_shim(tmp_path, files, _odd_bytes(4 << 20))
        assert record.returncode == 0, diagnostics
        assert 0 < record.log_bytes < 4 << 20  # the disk took what it could
        assert record.log_lost_bytes > 0, diagnostics
        tail = files.log.read_bytes()[-200:]
        assert b"of output lost here" in tail and tail.endswith(b"\n"), tail
        assert not files.exit_reserve.exists()
    finally:
        release_small_fs(attempt_dir)
