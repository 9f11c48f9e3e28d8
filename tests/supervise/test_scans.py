"""Data scans in child processes: bounded in time by the child itself and by the parent."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from muster.errors import ConfigError
from muster.supervise.manifest import scan_manifest
from muster.supervise.scans import DataScans, ScanFailed
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # scans run in child processes


def _tree(root: Path) -> Path:
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        (root / name / "x.png").write_bytes(b"png")
    return root


def test_a_scan_runs_in_a_child_and_counts_what_the_walk_counts(tmp_path: Path) -> None:
    data = _tree(tmp_path / "data")
    scans = DataScans()
    assert scans.poll(7, data, [".png"], "from_dirs") is None  # started, not waited for
    found = wait_until(lambda: scans.poll(7, data, [".png"], "from_dirs"), timeout=30,
                       what="the scan")
    here = scan_manifest(data, [".png"], "from_dirs")
    assert (found.file_count, found.classes, found.fingerprint) == (
        2, {"a": 1, "b": 1}, here.fingerprint) and scans.running() == []


def test_a_problem_with_the_data_is_named(tmp_path: Path) -> None:
    scans = DataScans()
    scans.poll(1, tmp_path / "missing", None, "none")
    failed = wait_until(lambda: scans.poll(1, tmp_path / "missing", None, "none"), timeout=30,
                        what="the scan")
    assert failed == ScanFailed(f"the data directory {tmp_path / 'missing'} does not exist "
                                "(data.path)")


def test_a_scan_past_its_deadline_is_killed(tmp_path: Path) -> None:
    """A scan frozen on a dead network disk (here: SIGSTOP) ends the trial's wait, not the
    server's: the parent kills it after the deadline."""
    data = _tree(tmp_path / "data")
    scans = DataScans(timeout_s=0.2, kill_after_s=0.2)
    scans.poll(3, data, None, "none")
    [child] = [r.child for r in scans._running.values()]
    os.kill(child.pid, signal.SIGSTOP)
    failed = wait_until(lambda: scans.poll(3, data, None, "none"), timeout=30, what="the kill")
    assert failed == ScanFailed(f"the scan of {data} took longer than 0.2 s; point data.path "
                                "at the data set itself")
    assert child.returncode == -signal.SIGKILL and scans.running() == []


def test_the_walk_stops_itself_at_its_deadline(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did not finish in time"):
        scan_manifest(_tree(tmp_path / "data"), None, "none", seconds=-1)


def test_scans_of_trials_that_stopped_waiting_are_stopped(tmp_path: Path) -> None:
    data = _tree(tmp_path / "data")
    scans = DataScans()
    scans.poll(1, data, None, "none")
    scans.poll(2, data, None, "none")
    first, _ = [r.child for r in scans._running.values()]
    os.kill(first.pid, signal.SIGSTOP)
    scans.forget_all_but({2})
    assert scans.running() == [2] and first.returncode == -signal.SIGKILL
