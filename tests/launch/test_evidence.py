"""The evidence collector on real stuck processes: py-spy's stacks and the one-line summary,
faulthandler's where py-spy is missing (and no signal to a process that did not ask for
it), the process table, the log's tail, the flight recorder's dumps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from muster.atomic import atomic_write_json
from muster.launch.evidence import (
    LOG_TAIL,
    PROCESSES,
    STACKS,
    STACKS_JSON,
    SUMMARY,
    Tools,
    collect,
    read_summary,
)
from muster.launch.identity import is_alive, read_identity
from muster.rundir import RunDir, new_bundle_id
from muster.states import EvidenceReason
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle

STUCK = Path(__file__).resolve().parent.parent / "fixtures" / "stuck.py"


def marked_line(marker: str) -> int:
    """The line of tests/fixtures/stuck.py that carries `# <marker>`."""
    lines = STUCK.read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.endswith(f"# {marker}"))


Start = Callable[..., subprocess.Popen[bytes]]
# What would make the harness think it runs on the platform, or as one rank of several.
_RUN_VARIABLES = {"MUSTER_RUN_DIR", "MUSTER_ATTEMPT", "RANK", "WORLD_SIZE"}


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start stuck.py in a session of its own, its output into `log`; wait until it is stuck.
    Every group started is SIGKILLed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def run(log: Path, *args: str, env: dict[str, str] | None = None,
            wait: bool = True) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        inherited = {k: v for k, v in os.environ.items() if k not in _RUN_VARIABLES}
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(STUCK), *args], stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**inherited, **(env or {})}, cwd=tmp_path)
        started.append(proc)
        if wait:
            wait_stuck(log, proc)
        return proc

    yield run
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_stuck(log: Path, proc: subprocess.Popen[bytes]) -> None:
    wait_until(lambda: b"stuck" in log.read_bytes() or proc.poll() is not None,
               timeout=60, what=f"{proc.args} to get stuck")
    assert proc.poll() is None, log.read_text()


def _bundle(attempt_dir: Path, rank: int) -> Path:
    return RunDir(attempt_dir.parent).attempt(1).evidence_of(
        new_bundle_id(EvidenceReason.REQUESTED.value), rank)


def _collector(out: Path, rank: int, log: Path, pgid: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "muster.launch.evidence", "--out", str(out), "--rank", str(rank),
         "--log", str(log), "--pgid", str(pgid)], stdout=subprocess.PIPE, text=True)


def test_a_deadlocked_scripts_bundle_names_the_line_of_the_lock(tmp_path: Path,
                                                                  start: Start) -> None:
    files = RunDir(tmp_path / "run").attempt(1).rank(0)
    proc = start(files.log, "lock")
    out = _bundle(files.attempt_dir, 0)
    collector = _collector(out, 0, files.log, proc.pid)
    printed, _ = collector.communicate(timeout=60)
    line = marked_line("LOCK_LINE")
    assert collector.returncode == 0
    assert printed.strip() == f"rank 0 waits in Lock.acquire at stuck.py:{line}"
    summary = read_summary(out)
    assert summary is not None and summary.tool == "py-spy" and summary.errors == []
    assert summary.main_thread is not None
    assert (summary.main_thread.pid, summary.main_thread.line) == (proc.pid, line)
    assert summary.processes == 1
    [process] = json.loads((out / PROCESSES).read_text())
    assert process["pid"] == proc.pid and process["python"] is True
    assert process["state"] == "S" and process["threads"] == 2
    assert process["start_ticks"] == read_identity(proc.pid).start_ticks  # type: ignore[union-attr]
    assert "stuck.py lock" in process["cmdline"] and process["rss_bytes"] > 0
    stacks = (out / STACKS).read_text()
    assert f"wait_on_lock (stuck.py:{line})" in stacks and "hold (stuck.py:" in stacks
    assert json.loads((out / STACKS_JSON).read_text())[0]["pid"] == proc.pid
    assert (out / LOG_TAIL).read_bytes() == b"stuck\n"
    assert proc.poll() is None  # evidence, not an end


def test_two_gloo_ranks_each_name_where_they_wait(tmp_path: Path, start: Start) -> None:
    attempt = RunDir(tmp_path / "run").attempt(1)
    store = str(tmp_path / "store")
    procs = [start(attempt.rank(rank).log, "all-reduce", store, env={"RANK": str(rank)},
                   wait=False) for rank in (0, 1)]
    for rank, proc in enumerate(procs):
        wait_stuck(attempt.rank(rank).log, proc)
    bundle = new_bundle_id(EvidenceReason.STALLED.value)
    collectors = [_collector(attempt.evidence_of(bundle, rank), rank, attempt.rank(rank).log,
                             proc.pid) for rank, proc in enumerate(procs)]
    printed = [c.communicate(timeout=60)[0].strip() for c in collectors]
    assert printed == [f"rank 0 waits in time.sleep at stuck.py:{marked_line('SLEEP_LINE')}",
                       f"rank 1 waits in all_reduce at stuck.py:{marked_line('ALL_REDUCE_LINE')}"]
    for rank in (0, 1):
        summary = read_summary(attempt.evidence_of(bundle, rank))
        assert summary is not None and summary.rank == rank and summary.line == printed[rank]
    native = (attempt.evidence_of(bundle, 1) / STACKS).read_text()
    assert "c10d::" in native  # torch's C++ frames, where --native could read them


def test_without_py_spy_the_harness_prints_its_stacks_on_its_signal(tmp_path: Path,
                                                                      start: Start) -> None:
    files = RunDir(tmp_path / "muster-run").attempt(1).rank(0)  # a run off the platform
    proc = start(files.log, "harness-lock")
    wait_until(files.stack_signal.exists, what="the harness's registration")
    out = _bundle(files.attempt_dir, 0)
    summary = collect(out, 0, files.log, proc.pid, Tools(py_spy=None))
    assert summary.tool == "faulthandler"
    assert summary.line == f"rank 0 in wait_on_lock at stuck.py:{marked_line('LOCK_LINE')}"
    assert summary.errors == ["py-spy is not installed beside muster's Python or on PATH"]
    stacks = (out / STACKS).read_text()
    assert "(faulthandler)" in stacks and "Current thread" in stacks
    assert proc.poll() is None


def test_no_signal_reaches_a_process_that_did_not_register_for_it(tmp_path: Path,
                                                                    start: Start) -> None:
    files = RunDir(tmp_path / "run").attempt(1).rank(0)
    proc = start(files.log, "lock")
    identity = read_identity(proc.pid)
    assert identity is not None
    summary = collect(_bundle(files.attempt_dir, 0), 0, files.log, proc.pid, Tools(None))
    assert summary.tool is None and summary.main_thread is None
    assert summary.line.startswith("rank 0: no stack could be read (py-spy is not installed")
    # A registration naming it, though it never installed the handler: still no signal, for
    # SIGUSR2's default action would end it.
    atomic_write_json(files.stack_signal, {"pid": proc.pid, "start_ticks": identity.start_ticks,
                                           "signal": int(signal.SIGUSR2)})
    summary = collect(_bundle(files.attempt_dir, 0), 0, files.log, proc.pid, Tools(None))
    assert any("no longer catches signal" in error for error in summary.errors)
    assert is_alive(identity)


def test_the_flight_recorders_dumps_are_copied_but_never_through_a_link(
        tmp_path: Path, start: Start) -> None:
    files = RunDir(tmp_path / "run").attempt(1).rank(0)
    files.attempt_dir.mkdir(parents=True)
    prefix = files.attempt_dir / "flight-"
    (files.attempt_dir / "flight-0").write_bytes(b"pickled entries")
    (files.attempt_dir / "flight-1").symlink_to("/etc/passwd")
    proc = start(files.log, "lock", env={"TORCH_FR_BUFFER_SIZE": "2000",
                                         "TORCH_FR_DUMP_TEMP_FILE": str(prefix)})
    out = _bundle(files.attempt_dir, 0)
    summary = collect(out, 0, files.log, proc.pid)
    assert summary.flight_recorder == ["flight-0"]
    assert (out / "flight-recorder" / "flight-0").read_bytes() == b"pickled entries"
    assert not (out / "flight-recorder" / "flight-1").exists()
    assert any("flight-1" in error for error in summary.errors)


def test_a_recorder_without_a_dump_file_is_said(tmp_path: Path, start: Start) -> None:
    files = RunDir(tmp_path / "run").attempt(1).rank(0)
    proc = start(files.log, "lock", env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "20"})
    summary = collect(_bundle(files.attempt_dir, 0), 0, files.log, proc.pid)
    assert summary.flight_recorder == []
    assert any("TORCH_FR_DUMP_TEMP_FILE" in error for error in summary.errors)


def _ended_group() -> int:
    """The process group of a process that has ended (its leader's pid)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_group_that_is_gone_and_a_missing_log(tmp_path: Path) -> None:
    files = RunDir(tmp_path / "run").attempt(1).rank(3)
    out = _bundle(files.attempt_dir, 3)
    summary = collect(out, 3, files.log, _ended_group(), Tools(None))
    assert summary.line == "rank 3: no process left in its group" and summary.processes == 0
    assert any("rank-3.log" in error for error in summary.errors)
    assert read_summary(out) == summary


def test_the_log_tail_keeps_the_last_lines_read_from_the_end(tmp_path: Path) -> None:
    files = RunDir(tmp_path / "run").attempt(1).rank(0)
    files.attempt_dir.mkdir(parents=True)
    body = b"x" * 300_000 + b"\n" + b"".join(b"line %d\n" % n for n in range(300)) + b"partial"
    files.log.write_bytes(body)
    out = _bundle(files.attempt_dir, 0)
    collect(out, 0, files.log, _ended_group(), Tools(None))
    tail = (out / LOG_TAIL).read_bytes().splitlines()
    assert len(tail) == 200 and tail[0] == b"line 101" and tail[-1] == b"partial"


def test_the_log_tail_of_a_capped_log_goes_around_what_the_cap_dropped(tmp_path: Path) -> None:
    """A log whose middle resources.log_limit punched out: the tail is read around the
    hole (never its NULs), ending with the latest output."""
    from tests.launch.test_log_limit import _pump

    files = RunDir(tmp_path / "run").attempt(1).rank(0)
    lines = [b"%06d " % n + b"y" * 20_000 + b"\n" for n in range(160)]  # ~3 MiB
    _pump(files, b"".join(lines))
    out = _bundle(files.attempt_dir, 0)
    collect(out, 0, files.log, _ended_group(), Tools(None))
    tail = (out / LOG_TAIL).read_bytes()
    assert b"\0" not in tail and tail.endswith(lines[-1])
    assert 0 < len(tail) <= 256 * 1024


def test_a_summary_exists_only_once_it_is_whole(tmp_path: Path) -> None:
    assert read_summary(tmp_path) is None
    (tmp_path / SUMMARY).write_text('["not", "a", "summary"]')
    assert read_summary(tmp_path) is None
