"""The orchestrator's wake-ups: real inotify on real attempt directories, real pidfds of
real processes. What wakes a pass at once, what wakes one soon, what wakes none."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from muster import inotify
from muster.atomic import atomic_write_json
from muster.inotify import Inotify, InotifyEvent
from muster.server import wakeups as wakeups_module
from muster.server.wakeups import Wake, Wakeups, Watched, classify

pytestmark = pytest.mark.skipif(Inotify.open() is None, reason="no inotify on this system")


@pytest.mark.parametrize(("mask", "name", "in_metrics_file", "wake"), [
    (inotify.MOVED_TO, "rank-0.shim.json", False, Wake.NOW),
    (inotify.MOVED_TO, "rank-3.exit.json", False, Wake.NOW),
    (inotify.CLOSE_WRITE, "rank-0.exit.json", False, Wake.NOW),
    (inotify.CREATE, "rank-0.exit.json", False, Wake.NONE),  # still empty: its close says
    (inotify.MOVED_TO, "rank-1.heartbeat.json", False, Wake.CHECK_IN),
    (inotify.MOVED_FROM, "rank-1.heartbeat.json", False, Wake.FORGET),
    (inotify.DELETE, "rank-1.heartbeat.json", False, Wake.FORGET),
    (inotify.MOVED_FROM, "rank-1.exit.json", False, Wake.NONE),
    (inotify.CREATE, "rank-0.metrics.jsonl", False, Wake.METRICS_FILE),
    (inotify.MODIFY, "", True, Wake.SOON),
    (inotify.CLOSE_WRITE, "", True, Wake.NONE),
    (inotify.CREATE, "rank-0.log", False, Wake.NONE),
    (inotify.CLOSE_WRITE, "rank-0.log", False, Wake.NONE),
    (inotify.MOVED_TO, "rank-0.snapshot.json", False, Wake.NONE),
    (inotify.CLOSE_WRITE, ".rank-0.exit.json.tmp-12", False, Wake.NONE),
    (inotify.CREATE, "restarts", False, Wake.NONE),
    (inotify.Q_OVERFLOW, "", False, Wake.NOW),
])
def test_classify(mask: int, name: str, in_metrics_file: bool, wake: Wake) -> None:
    assert classify(InotifyEvent(1, mask, name), in_metrics_file) is wake


class Recorder:
    """A loop with `Wakeups` on it and the times `wake` was called (loop time)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.woken: list[float] = []
        started = Wakeups.start(self.loop, lambda: self.woken.append(self.loop.time()))
        assert started is not None
        self.wakeups = started

    def run(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def run_until_woken(self, count: int, timeout: float = 10.0) -> None:
        async def wait() -> None:
            while len(self.woken) < count:
                await asyncio.sleep(0.005)
        self.loop.run_until_complete(asyncio.wait_for(wait(), timeout))

    def after_pass(self, dirs: dict[int, Path], pids: list[int] | None = None) -> None:
        self.wakeups.update(Watched(dirs, pids or []))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    made = Recorder()
    yield made
    made.wakeups.close()
    made.loop.close()


@pytest.fixture
def attempt_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "attempt-1"
    path.mkdir(parents=True)
    return path


def test_a_start_and_an_end_wake_a_pass_at_once(recorder: Recorder, attempt_dir: Path) -> None:
    recorder.after_pass({7: attempt_dir})
    recorder.run_until_woken(1)  # a new watch: a pass soon looks at what came before it
    recorder.woken.clear()
    atomic_write_json(attempt_dir / "rank-0.shim.json", {"pid": 1})
    recorder.run_until_woken(1)
    atomic_write_json(attempt_dir / "rank-0.exit.json", {"code": 0})
    recorder.run_until_woken(2)


def test_only_the_first_heartbeat_of_a_rank_wakes(recorder: Recorder, attempt_dir: Path) -> None:
    recorder.after_pass({7: attempt_dir})
    recorder.run_until_woken(1)
    recorder.woken.clear()
    heartbeat = attempt_dir / "rank-0.heartbeat.json"
    atomic_write_json(heartbeat, {"step": None})
    recorder.run_until_woken(1)
    for step in range(5):
        atomic_write_json(heartbeat, {"step": step})
    (attempt_dir / "rank-0.log").write_bytes(b"lines\n" * 1000)
    recorder.run(0.3)
    assert len(recorder.woken) == 1
    # A restart in place moves the rank's files aside: its next heartbeat is a check-in.
    (attempt_dir / "restarts").mkdir()
    heartbeat.rename(attempt_dir / "restarts" / "rank-0.heartbeat.json.1")
    atomic_write_json(heartbeat, {"step": None})
    recorder.run_until_woken(2)


def test_metrics_lines_wake_one_pass_soon_however_many(recorder: Recorder,
                                                       attempt_dir: Path) -> None:
    recorder.after_pass({7: attempt_dir})
    recorder.run_until_woken(1)
    recorder.woken.clear()
    metrics = attempt_dir / "rank-0.metrics.jsonl"
    with metrics.open("a") as out:
        out.write("{}\n")  # the file appearing: watched from now on, and a pass soon
        out.flush()
        recorder.run_until_woken(1)
        recorder.after_pass({7: attempt_dir})  # that pass ran
        recorder.wakeups.rearm()
        for _ in range(2000):
            out.write("{}\n")
            out.flush()
        recorder.run_until_woken(2)
        woken_at = recorder.woken[1]
        for _ in range(2000):  # its watch is dropped until the next pass: no more wake-ups
            out.write("{}\n")
            out.flush()
        recorder.run(wakeups_module.SOON_SECONDS + 0.2)
        assert len(recorder.woken) == 2
        # Never sooner than SOON_SECONDS after the last pass ended.
        assert woken_at - recorder.woken[0] >= wakeups_module.SOON_SECONDS * 0.9
        recorder.wakeups.rearm()  # the next pass: watched again
        out.write("{}\n")
        out.flush()
        recorder.run_until_woken(3)


def test_a_metrics_file_there_before_the_watch_is_watched(recorder: Recorder,
                                                           attempt_dir: Path) -> None:
    metrics = attempt_dir / "rank-2.metrics.jsonl"
    metrics.write_text("{}\n")
    recorder.after_pass({7: attempt_dir})
    recorder.run_until_woken(1)
    recorder.after_pass({7: attempt_dir})
    recorder.run(wakeups_module.SOON_SECONDS + 0.1)
    assert len(recorder.woken) == 1
    with metrics.open("a") as out:
        out.write("{}\n")
    recorder.run_until_woken(2)


def test_an_attempt_no_longer_followed_wakes_nothing(recorder: Recorder,
                                                     attempt_dir: Path) -> None:
    recorder.after_pass({7: attempt_dir})
    recorder.run_until_woken(1)
    recorder.after_pass({})
    atomic_write_json(attempt_dir / "rank-0.exit.json", {"code": 0})
    recorder.run(0.3)
    assert len(recorder.woken) == 1


def test_a_directory_that_is_gone_is_skipped(recorder: Recorder, tmp_path: Path) -> None:
    recorder.after_pass({7: tmp_path / "removed"})
    recorder.run(0.3)
    assert recorder.woken == []
    assert recorder.wakeups.complete


def test_the_end_of_a_process_a_pass_waits_on_wakes_it(recorder: Recorder,
                                                        tmp_path: Path) -> None:
    gate = tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                              f"while not os.path.exists({str(gate)!r}): time.sleep(0.01)"])
    try:
        recorder.after_pass({}, [child.pid])
        recorder.run(0.2)
        assert recorder.woken == []
        gate.touch()
        recorder.run_until_woken(1)
    finally:
        child.wait()
    recorder.after_pass({}, [])


def test_an_ended_process_left_unreaped_wakes_one_pass_only(recorder: Recorder) -> None:
    # A scan whose trial is not admitted yet stays unreaped across passes: its pidfd would
    # be readable at once each time, and the passes would spin.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        recorder.after_pass({}, [child.pid])
        recorder.run_until_woken(1)
        for _ in range(3):  # passes that still list it
            recorder.after_pass({}, [child.pid])
            recorder.run(0.1)
        assert len(recorder.woken) == 1
    finally:
        child.wait()


def test_a_directory_removed_as_it_is_watched_leaves_the_rest_working(
        recorder: Recorder, tmp_path: Path) -> None:
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    gone.mkdir()
    kept.mkdir()
    recorder.after_pass({1: gone, 2: kept})
    gone.rmdir()
    recorder.run_until_woken(1)
    recorder.after_pass({1: gone, 2: kept})
    atomic_write_json(kept / "rank-0.exit.json", {"code": 0})
    recorder.run_until_woken(2)
