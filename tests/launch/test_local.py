"""LocalLauncher + shim lifecycle, with real fixture scripts and real processes."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import importlib.util
import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from muster.errors import LaunchError
from muster.launch.base import ProcessIdentity, ReplicaSpec
from muster.launch.identity import (
    group_members,
    is_alive,
    own_identity,
    read_identity,
    send_signal,
)
from muster.launch.local import LocalLauncher
from muster.launch.records import spec_to_json
from muster.states import ReplicaPhase
from tests.launch.conftest import FIXTURES, Replica, SubmitFn, fixture_argv
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes

def test_exit0_is_recorded_with_its_output(submit: SubmitFn) -> None:
    replica = submit("exit0.sh")
    record = replica.wait_exit()
    status = replica.describe()
    assert status.phase is ReplicaPhase.EXITED
    assert (record.returncode, record.exit_code, record.signal) == (0, 0, None)
    assert replica.log() == b"hello from exit0\n"
    assert record.log_bytes == len(b"hello from exit0\n")
    assert status.child == ProcessIdentity(record.pid or 0, record.start_ticks or 0)
    assert record.max_rss_bytes is not None and record.max_rss_bytes > 0
    assert record.started_at is not None and record.started_at <= record.ended_at
    assert not record.stop_requested and record.signals_sent == []


def test_a_traceback_exits_1_and_is_logged(submit: SubmitFn) -> None:
    replica = submit("fail_traceback.py")
    record = replica.wait_exit()
    assert (record.returncode, record.exit_code, record.signal) == (1, 1, None)
    log = replica.log()
    assert log.startswith(b"training step 1\n")
    assert b"Traceback (most recent call last)" in log
    assert log.endswith(b"ValueError: bad shape\n")


def test_exit_2_is_recorded(submit: SubmitFn) -> None:
    record = submit("exit2.sh").wait_exit()
    assert (record.returncode, record.exit_code, record.signal) == (2, 2, None)


@pytest.mark.parametrize(("name", "signum"), [("SIGSEGV", 11), ("SIGABRT", 6)])
def test_death_by_signal_is_named(submit: SubmitFn, name: str, signum: int) -> None:
    replica = submit("kill_self.py", name)
    record = replica.wait_exit()
    assert (record.returncode, record.exit_code, record.signal) == (-signum, 128 + signum, name)
    assert replica.log() == f"about to raise {name}\n".encode()


def test_every_line_written_before_a_sigkill_is_logged(submit: SubmitFn) -> None:
    replica = submit("lines_then_sigkill.py", "5000")
    record = replica.wait_exit()
    assert (record.returncode, record.signal) == (-9, "SIGKILL")
    assert replica.log() == b"".join(b"line %d\n" % i for i in range(5000))
    assert not record.stop_requested and record.signals_sent == []


def test_50_mb_flood_is_logged_byte_identical(submit: SubmitFn) -> None:
    size = 50_000_000
    replica = submit("flood.py", str(size))
    record = replica.wait_exit()
    assert record.returncode == 0
    assert record.log_bytes == size
    expected = hashlib.sha256(_flood_module().pattern_bytes(size)).hexdigest()
    assert hashlib.sha256(replica.files.log.read_bytes()).hexdigest() == expected
    _assert_index_covers(replica, size)


def _flood_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flood", FIXTURES / "flood.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_index_covers(replica: Replica, size: int) -> None:
    """Index lines start at 0, rise strictly, stay inside the log, and time never runs back."""
    rows = [line.split() for line in replica.files.index.read_text().splitlines()]
    offsets = [int(offset) for offset, _ in rows]
    times = [float(stamp) for _, stamp in rows]
    assert offsets[0] == 0
    assert offsets == sorted(set(offsets)) and offsets[-1] < size
    assert times == sorted(times)
    assert all(len(stamp.split(".")[1]) == 6 for _, stamp in rows)


def test_undecodable_bytes_are_logged_exactly(submit: SubmitFn) -> None:
    replica = submit("odd_bytes.py")
    record = replica.wait_exit()
    assert record.returncode == 0
    odd_stdout = b"invalid utf-8: \xff\xfe\xc3\x28 | gbk: " + "中文日志".encode("gbk")
    odd_stderr = b"\x00nul\x00 and a half sequence \xe2\x82 no newline"
    assert replica.files.log.read_bytes() == odd_stdout + odd_stderr


@pytest.mark.parametrize("problem", ["missing program", "missing cwd", "not executable"])
def test_spawn_failure_is_recorded_with_a_sentence(
    launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec], tmp_path: Path, problem: str
) -> None:
    program, spec = _unstartable(make_spec, tmp_path, problem)
    launcher.submit(spec)
    record = Replica(launcher, spec).wait_exit()
    assert record.spawn_error is not None and program in record.spawn_error
    assert record.spawn_errno == (errno.EACCES if problem == "not executable" else errno.ENOENT)
    assert (record.returncode, record.exit_code, record.pid) == (None, None, None)
    if problem == "missing cwd":
        assert str(spec.cwd) in record.spawn_error


def _unstartable(
    make_spec: Callable[..., ReplicaSpec], tmp_path: Path, problem: str
) -> tuple[str, ReplicaSpec]:
    if problem == "missing program":
        program = str(tmp_path / "no-such-train.py")
        return program, make_spec([program, "--epochs", "1"])
    if problem == "missing cwd":
        program = str(FIXTURES / "exit0.sh")
        return program, dataclasses.replace(make_spec([program]), cwd=tmp_path / "gone")
    plain = tmp_path / "train.sh"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o644)
    return str(plain), make_spec([str(plain)])


def test_cancel_is_idempotent(submit: SubmitFn, tmp_path: Path) -> None:
    replica = submit("wait_for_file.py", str(tmp_path / "never"))
    replica.wait_log(b"waiting\n")
    replica.cancel()
    replica.cancel()
    record = replica.wait_exit()
    replica.cancel()
    assert (record.returncode, record.exit_code, record.signal) == (-15, 143, "SIGTERM")
    assert record.stop_requested and record.signals_sent == ["SIGTERM"]
    status = replica.describe()
    assert status.phase is ReplicaPhase.EXITED and status.stop_requested
    assert replica.wait_exit() == record


def test_cancel_sends_sigkill_after_the_grace(submit: SubmitFn, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    replica = submit("ignore_term.py", str(ready), stop_grace=1.0)
    wait_until(ready.exists, timeout=30, what="the child to ignore SIGTERM")
    replica.cancel()
    record = replica.wait_exit()
    assert (record.returncode, record.signal) == (-9, "SIGKILL")
    assert record.stop_requested and record.signals_sent == ["SIGTERM", "SIGKILL"]
    assert b"ignoring SIGTERM\n" in replica.log()


def test_cancel_kills_the_whole_process_group(submit: SubmitFn, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    replica = submit("grandchild.py", str(pid_file), "sleep", stop_grace=1.0)
    grandchild = _grandchild(pid_file)
    child = replica.child()
    replica.cancel()
    record = replica.wait_exit()
    assert record.stop_requested and record.returncode == -15
    assert not is_alive(grandchild)
    assert group_members(child.pid) == []


def test_a_grandchild_left_behind_dies_with_the_child(submit: SubmitFn, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    replica = submit("grandchild.py", str(pid_file), "exit")
    record = replica.wait_exit()
    grandchild = _grandchild(pid_file)
    assert record.returncode == 0 and not record.stop_requested
    assert not is_alive(grandchild)
    assert group_members(record.pid or 0) == []
    assert "left in its group" in replica.files.shim_log.read_text()


def test_a_process_that_left_the_group_cannot_hold_the_shim(
    submit: SubmitFn, tmp_path: Path
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    replica = submit("grandchild.py", str(pid_file), "escape")
    try:
        record = replica.wait_exit()
        assert record.returncode == 0
        assert b"grandchild ready, mode escape\n" in replica.log()
        assert "gave up reading the log pipe" in replica.files.shim_log.read_text()
    finally:
        send_signal(_grandchild(pid_file), signal.SIGKILL)


def _grandchild(pid_file: Path) -> ProcessIdentity:
    wait_until(pid_file.exists, timeout=30, what="the grandchild's pid file")
    identity = read_identity(int(pid_file.read_text()))
    assert identity is not None
    return identity


def test_a_stop_marker_before_start_starts_nothing(
    launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec], tmp_path: Path
) -> None:
    spec = make_spec(fixture_argv("exit0.sh"))
    spec.attempt_dir.mkdir()
    (spec.attempt_dir / "rank-0.stop").touch()
    launcher.submit(spec)
    record = Replica(launcher, spec).wait_exit()
    assert record.stop_requested and record.pid is None and record.returncode is None
    assert record.spawn_error is None and record.log_bytes == 0


def test_a_sigterm_during_shim_start_up_is_not_lost(submit: SubmitFn, tmp_path: Path) -> None:
    replica = submit("wait_for_file.py", str(tmp_path / "never"))
    shim = replica.describe().shim
    assert shim is not None
    assert send_signal(shim, signal.SIGTERM)
    record = replica.wait_exit()
    assert record.stop_requested
    assert record.returncode in (None, -15)


def test_a_fresh_launcher_reattaches(submit: SubmitFn, tmp_path: Path) -> None:
    release = tmp_path / "release"
    replica = submit("wait_for_file.py", str(release))
    replica.wait_log(b"waiting\n")
    restarted = LocalLauncher()
    status = replica.describe(restarted)
    assert status.phase is ReplicaPhase.RUNNING
    assert status.child is not None and is_alive(status.child)
    assert status.started_at is not None  # known while it runs, not only from the exit record
    release.touch()
    record = wait_until(lambda: replica.describe(restarted).exit, timeout=30, what="exit")
    assert record is not None and record.returncode == 0
    assert record.started_at == status.started_at == replica.describe(restarted).started_at
    assert replica.describe(restarted).phase is ReplicaPhase.EXITED


def test_a_fresh_launcher_can_cancel(submit: SubmitFn, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    replica = submit("ignore_term.py", str(ready), stop_grace=1.0)
    wait_until(ready.exists, timeout=30, what="the child to ignore SIGTERM")
    replica.cancel(LocalLauncher())
    record = replica.wait_exit()
    assert record.signals_sent == ["SIGTERM", "SIGKILL"]


def test_the_shim_outlives_the_process_that_launched_it(
    make_spec: Callable[..., ReplicaSpec], tmp_path: Path
) -> None:
    release = tmp_path / "release"
    spec = make_spec(fixture_argv("wait_for_file.py", str(release)))
    spec_json = tmp_path / "spec-for-server.json"
    spec_json.write_text(json.dumps(spec_to_json(spec)))
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(spec_json)], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline() == "submitted\n"
    server.kill()
    assert server.wait() == -9
    replica = Replica(LocalLauncher(), spec)
    replica.wait_log(b"waiting\n")
    assert replica.describe().phase is ReplicaPhase.RUNNING
    release.touch()
    record = replica.wait_exit()
    assert record.returncode == 0
    assert replica.log() == b"waiting\nreleased\n"


_SERVER = """
import json, sys, time
from pathlib import Path
from muster.launch.local import LocalLauncher
from muster.launch.records import spec_from_json

LocalLauncher().submit(spec_from_json(json.loads(Path(sys.argv[1]).read_text())))
print("submitted", flush=True)
time.sleep(600)
"""


def test_cancel_kills_the_group_itself_when_the_shim_is_gone(
    submit: SubmitFn, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    replica = submit("ignore_term.py", str(ready), stop_grace=60.0)
    wait_until(ready.exists, timeout=30, what="the child to ignore SIGTERM")
    child = replica.child()
    shim = replica.describe().shim
    assert shim is not None and child is not None
    assert send_signal(shim, signal.SIGKILL)
    wait_until(lambda: not is_alive(shim), timeout=30, what="the shim to die")
    assert replica.describe().phase is ReplicaPhase.RUNNING  # its child lives on
    replica.cancel()
    wait_until(lambda: not is_alive(child), timeout=30, what="the child to die")
    assert replica.describe().phase is ReplicaPhase.LOST
    assert replica.describe().stop_requested


def test_log_iter_reads_from_an_offset(submit: SubmitFn) -> None:
    replica = submit("exit0.sh")
    replica.wait_exit()
    attempt_dir, rank = replica.spec.attempt_dir, replica.spec.rank
    assert b"".join(replica.launcher.log_iter(attempt_dir, rank, offset=6)) == b"from exit0\n"
    assert list(replica.launcher.log_iter(attempt_dir, rank, offset=17)) == []
    assert list(replica.launcher.log_iter(attempt_dir, rank + 1)) == []


def test_submitting_a_replica_twice_is_refused(
    launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec]
) -> None:
    spec = make_spec(fixture_argv("exit0.sh"))
    launcher.submit(spec)
    Replica(launcher, spec).wait_exit()
    with pytest.raises(LaunchError, match="already launched"):
        launcher.submit(spec)


def test_an_unusable_attempt_dir_is_a_launch_error(
    launcher: LocalLauncher, make_spec: Callable[..., ReplicaSpec], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    spec = dataclasses.replace(make_spec(fixture_argv("exit0.sh")), attempt_dir=blocker / "x")
    with pytest.raises(LaunchError, match="Could not launch rank 0"):
        launcher.submit(spec)


def test_cancel_of_an_unknown_attempt_does_nothing(launcher: LocalLauncher, tmp_path: Path) -> None:
    launcher.cancel(tmp_path / "never-launched", 0)
    assert not (tmp_path / "never-launched").exists()


def test_the_shim_signals_the_server_at_the_childs_start_and_end(
        make_spec: Callable[..., ReplicaSpec], tmp_path: Path) -> None:
    """`LocalLauncher.notify`: SIGUSR1 once status.json is written (the child runs), again
    once the exit record is (the server then settles at once instead of at its next pass)."""
    received: list[tuple[bool, bool]] = []  # (status written, exit written) at each signal
    launcher = LocalLauncher()
    launcher.notify = own_identity()
    spec = make_spec([sys.executable, "-c", "import time; time.sleep(1.5)"])
    files = Replica(launcher, spec).files

    def note(signum: int, frame: object) -> None:
        received.append((files.status.exists(), files.exit.exists()))

    previous = signal.signal(signal.SIGUSR1, note)
    try:
        launcher.submit(spec)
        wait_until(lambda: len(received) >= 1, timeout=30, what="the start signal")
        assert received[0] == (True, False)  # started, still running
        wait_until(lambda: len(received) >= 2, timeout=30, what="the end signal")
        assert received[1] == (True, True)
        assert len(received) == 2
    finally:
        signal.signal(signal.SIGUSR1, previous)
