"""The launcher's template methods: a plan that is a dry run, the act that carries it out,
an idempotent cancel, and logs served only through the launcher's log interface."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import BinaryIO

import pytest

from muster.launch.base import ProcessIdentity, ReplicaSpec
from muster.launch.local import LocalLauncher
from muster.launch.logs import LogPart, ReplicaLog, tail_text
from muster.launch.records import spec_from_json
from muster.launch.shim_launcher import SHIM
from muster.rundir import RankFiles
from muster.services.logs import LogSlice, MergedSlice, read_log
from muster.store import Store
from tests.launch.conftest import fixture_argv
from tests.server.rank_logs import add_trial_with_ranks
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts real processes

def spec_in(tmp_path: Path, *argv: str, rank: int = 0) -> ReplicaSpec:
    return ReplicaSpec(trial_uuid="t", attempt=1, rank=rank, argv=list(argv), env={"A": "1"},
                       cwd=tmp_path, attempt_dir=tmp_path / "attempt-1", stop_grace=2.0)


def test_plan_is_a_dry_run(tmp_path: Path) -> None:
    launcher = LocalLauncher()
    launcher.notify = ProcessIdentity(4242, 17)
    spec = spec_in(tmp_path, "python", "train.py")
    request = launcher.plan(spec)
    files = RankFiles(spec.attempt_dir, 0)
    assert not spec.attempt_dir.exists()  # nothing written, nothing started
    assert request.argv[1:] == ["-P", "-m", SHIM, str(files.spec)]
    assert request.cwd == spec.attempt_dir and request.env is None
    assert list(request.files) == [files.spec]
    written = spec_from_json(json.loads(request.files[files.spec]))
    assert written == request.spec and written.notify == (4242, 17)
    assert written.argv == ["python", "train.py"] and written.env == {"A": "1"}


def test_submit_carries_the_plan_out(tmp_path: Path) -> None:
    launcher = LocalLauncher()
    spec = spec_in(tmp_path, *fixture_argv("exit0.sh"))
    request = launcher.plan(spec)
    shim = launcher.submit(spec)
    files = RankFiles(spec.attempt_dir, 0)
    assert files.spec.read_bytes() == request.files[files.spec]
    assert json.loads(files.launch.read_text())["shim_pid"] == shim.pid
    wait_until(lambda: launcher.describe(spec.attempt_dir, 0).exit, what="the exit record")
    assert b"from exit0" in b"".join(launcher.log_iter(spec.attempt_dir, 0))


def test_cancel_is_idempotent_and_keeps_the_first_grace(tmp_path: Path) -> None:
    launcher = LocalLauncher()
    launcher.cancel(tmp_path / "never-launched", 0)
    assert not (tmp_path / "never-launched").exists()
    attempt_dir = tmp_path / "attempt-1"
    attempt_dir.mkdir()
    launcher.cancel(attempt_dir, 0, grace=1.5)
    launcher.cancel(attempt_dir, 0, grace=9.0)
    launcher.cancel(attempt_dir, 0)
    assert json.loads(RankFiles(attempt_dir, 0).stop.read_text()) == {"grace": 1.5}


class MemoryLog(ReplicaLog):
    """A log that lives nowhere on this machine's disk (as a remote launcher's would)."""

    def __init__(self, rank: int, parts: dict[LogPart, bytes]) -> None:
        super().__init__(rank)
        self.parts = parts

    def open(self, part: LogPart) -> BinaryIO | None:
        data = self.parts.get(part)
        return io.BytesIO(data) if data is not None else None


class RemoteLogs(LocalLauncher):
    """A launcher whose replicas' logs are served from memory, not from the run directory."""

    def __init__(self, logs: dict[int, dict[LogPart, bytes]]) -> None:
        super().__init__()
        self.logs = logs

    def log(self, attempt_dir: Path, rank: int) -> MemoryLog:  # type: ignore[override]
        return MemoryLog(rank, self.logs.get(rank, {}))

    def logged_ranks(self, attempt_dir: Path) -> list[int]:
        return sorted(self.logs)


def test_the_log_service_reads_only_through_the_launcher(store: Store, tmp_path: Path) -> None:
    run_dir = tmp_path / "attempt-1"  # never made: the bytes are the launcher's alone
    trial_id = add_trial_with_ranks(store, [run_dir], 2)
    launcher = RemoteLogs({
        0: {LogPart.LOG: b"zero a\nzero b\n", LogPart.INDEX: b"0 10.0\n7 12.0\n"},
        1: {LogPart.LOG: b"one a\n", LogPart.INDEX: b"0 11.0\n"},
    })
    assert read_log(store, launcher, trial_id, rank=0) == LogSlice(b"zero a\nzero b\n", 1, 0,
                                                                   14, 0)
    merged = read_log(store, launcher, trial_id)
    assert isinstance(merged, MergedSlice)
    assert merged.data == b"[rank 0] zero a\n[rank 1] one a\n[rank 0] zero b\n"
    assert read_log(store, launcher, trial_id, rank=1, tail=1).data == b"one a\n"
    assert tail_text(launcher.log(run_dir, 0), 1) == "zero b\n"
    # Without replica rows, the ranks are the ones the launcher has logs of.
    bare = add_trial_with_ranks(store, [tmp_path / "attempt-x"], 0)
    assert isinstance(read_log(store, launcher, bare), MergedSlice)
