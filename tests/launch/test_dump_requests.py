"""The shim's side of evidence requests (`muster.launch.dumps`): what it takes as a request
and where it lets the collector write. Under `run_as` the job owns the attempt directory
and the shim is root, so a request or a directory the job planted must never steer it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.launch.dumps import DumpRequests, request_dump
from muster.rundir import RankFiles

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: requests are taken "
                                "only from root when the shim is root")
NOBODY = 65534


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            process_group=0)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_request_makes_the_bundle_directory_and_runs_the_collector(
        tmp_path: Path, sleeper: int) -> None:
    files = RankFiles(tmp_path, 0)
    bundle = request_dump([files], "requested")
    requests = DumpRequests(files)
    requests.poll(sleeper)
    assert requests.busy
    requests.wait()
    assert not requests.busy
    made = tmp_path / "evidence" / bundle / "rank-0"
    assert made.is_dir() and not made.is_symlink()
    assert made.stat().st_uid == 0
    requests.poll(sleeper)  # the same request again: already served
    assert not requests.busy


def test_a_request_the_job_wrote_is_ignored(tmp_path: Path, sleeper: int) -> None:
    files = RankFiles(tmp_path, 0)
    bundle = request_dump([files], "requested")
    os.chown(files.dump, NOBODY, NOBODY)
    requests = DumpRequests(files)
    requests.poll(sleeper)
    assert not requests.busy
    assert not (tmp_path / "evidence" / bundle).exists()


@pytest.mark.parametrize("bundle", ["../../etc", "20260101T000000Z-x/../..", "", 7])
def test_a_request_for_a_path_is_ignored(tmp_path: Path, sleeper: int, bundle: object) -> None:
    files = RankFiles(tmp_path, 0)
    files.dump.write_text(json.dumps({"bundle": bundle, "reason": "requested"}))
    requests = DumpRequests(files)
    requests.poll(sleeper)
    assert not requests.busy
    assert not (tmp_path / "evidence").exists()


def test_a_planted_link_is_not_followed(tmp_path: Path, sleeper: int) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    (attempt / "evidence").symlink_to(elsewhere)
    files = RankFiles(attempt, 0)
    request_dump([files], "requested")
    requests = DumpRequests(files)
    requests.poll(sleeper)
    assert not requests.busy
    assert list(elsewhere.iterdir()) == []


def test_a_directory_of_another_user_is_not_written_in(tmp_path: Path, sleeper: int) -> None:
    (tmp_path / "evidence").mkdir()
    os.chown(tmp_path / "evidence", NOBODY, NOBODY)
    files = RankFiles(tmp_path, 0)
    request_dump([files], "requested")
    requests = DumpRequests(files)
    requests.poll(sleeper)
    assert not requests.busy
    assert list((tmp_path / "evidence").iterdir()) == []


def test_close_ends_a_collector_still_running(tmp_path: Path, sleeper: int) -> None:
    files = RankFiles(tmp_path, 0)
    request_dump([files], "requested")
    requests = DumpRequests(files)
    requests.poll(sleeper)
    assert requests.busy
    requests.close()
    assert not requests.busy
