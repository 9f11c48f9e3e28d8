"""The shim's activity stamp (`muster.launch.activity`) on real process groups: CPU used by
any process of the group moves it, a sleeping group does not; a link in its place is never
written through."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster.launch.activity import ActivityStamp, read_activity
from tests.waiting import wait_until

SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"
# The leader sleeps; a child it starts in the same group does the work.
CHILD_SPINS = ("import subprocess, sys, time\n"
               f"subprocess.Popen([sys.executable, '-c', {SPIN!r}])\n"
               "time.sleep(60)\n")


@pytest.fixture
def group() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        os.killpg(proc.pid, 9)
        proc.wait()


def start(group: list[subprocess.Popen[bytes]], code: str) -> int:
    proc = subprocess.Popen([sys.executable, "-c", code], process_group=0)
    group.append(proc)
    return proc.pid


def ticks_for(stamp: ActivityStamp, pgid: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stamp.tick(pgid)
        time.sleep(0.05)


@pytest.mark.parametrize("code", [SPIN, CHILD_SPINS], ids=["leader", "grandchild"])
def test_cpu_used_anywhere_in_the_group_moves_the_stamp(
        tmp_path: Path, group: list[subprocess.Popen[bytes]], code: str) -> None:
    pgid = start(group, code)
    began = time.time() - 100  # as if it started long ago and never printed
    stamp = ActivityStamp(tmp_path / "rank-0.active", began)
    ticks_for(stamp, pgid, 3.5)
    activity = read_activity(tmp_path / "rank-0.active")
    assert activity is not None
    assert activity.output_at == pytest.approx(began, abs=0.001)
    assert activity.cpu_at > time.time() - 2.5


def test_a_sleeping_group_stays_still(tmp_path: Path,
                                      group: list[subprocess.Popen[bytes]]) -> None:
    pgid = start(group, "import time; time.sleep(60)")
    stamp = ActivityStamp(tmp_path / "rank-0.active", time.time())
    ticks_for(stamp, pgid, 1.5)  # its start-up (imports) is CPU: let it pass
    settled = read_activity(tmp_path / "rank-0.active")
    assert settled is not None
    ticks_for(stamp, pgid, 3.5)
    assert read_activity(tmp_path / "rank-0.active") == settled


def test_output_moves_the_output_time_and_needs_no_scan(tmp_path: Path) -> None:
    began = time.time() - 50
    stamp = ActivityStamp(tmp_path / "rank-0.active", began)
    now = time.time()
    stamp.output(now)
    stamp.tick(pgid=2**22 + 12345)  # no such group: a scan would find nothing to move
    activity = wait_until(lambda: read_activity(tmp_path / "rank-0.active"),
                          what="the stamp to be written")
    assert activity.output_at == pytest.approx(now, abs=0.001)
    assert activity.cpu_at == pytest.approx(began, abs=0.001)


def test_a_link_in_its_place_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.link(victim, tmp_path / "rank-0.active")  # a hard link: O_NOFOLLOW does not stop it
    stamp = ActivityStamp(tmp_path / "rank-0.active", time.time())
    stamp.output(time.time())
    stamp.tick(pgid=2**22 + 12345)
    stamp.close()
    assert victim.read_text() == "precious\n"
    assert read_activity(tmp_path / "rank-0.active") is not None


def test_no_stamp_reads_as_none(tmp_path: Path) -> None:
    assert read_activity(tmp_path / "missing") is None
    (tmp_path / "torn").write_text("12")
    assert read_activity(tmp_path / "torn") is None
