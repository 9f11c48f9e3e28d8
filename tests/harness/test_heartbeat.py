"""The heartbeat tells progress from mere life: a blocked loop's thread beats, progress stands."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import muster.harness as mh
from tests.harness.conftest import Platform, start_script
from tests.waiting import wait_until

Beat = dict[str, Any]


def _beat(path: Path) -> Beat | None:
    try:
        beat: Beat = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return beat


def _wait_for_beat(path: Path, accept: Callable[[Beat], bool], what: str) -> Beat:
    def accepted() -> Beat | None:
        beat = _beat(path)
        return beat if beat is not None and accept(beat) else None

    beat = wait_until(accepted, timeout=20, what=what)
    assert beat is not None
    return beat


def test_init_checks_in_with_a_heartbeat(on_platform: Platform) -> None:
    path = on_platform.rank_file(".heartbeat.json")
    with mh.init(heartbeat_interval=60) as ctx:
        beat = _beat(path)
        assert beat is not None
        assert beat["step"] is None and beat["pid"] == os.getpid() and beat["interval"] == 60
        assert beat["written_at"] >= beat["progress_time"]
        ctx.report_training(1, {"loss": 1.0})
    final = _beat(path)
    assert final is not None and final["step"] == 1  # the final beat at exit


def test_every_progress_call_moves_the_heartbeat(on_platform: Platform) -> None:
    path = on_platform.rank_file(".heartbeat.json")
    with mh.init(heartbeat_interval=0.05) as ctx:
        calls: list[tuple[Callable[[], None], int]] = [
            (lambda: ctx.report_training(5, {"loss": 1.0}), 5),
            (lambda: ctx.report_validation(6, {"loss": 1.0}), 6),
            (lambda: ctx.heartbeat(step=7), 7),
            (lambda: ctx.samples.seen(1, epoch=0), 7),  # progress, but no step of its own
            (ctx.heartbeat, 7),
        ]
        for call, step in calls:
            before = _wait_for_beat(path, lambda _: True, "a heartbeat")["progress_time"]
            call()
            _wait_for_beat(path, _moved_to(step, before), f"step {step} after {before}")


def _moved_to(step: int, before: float) -> Callable[[Beat], bool]:
    return lambda beat: beat["step"] == step and beat["progress_time"] > before


@pytest.mark.lifecycle  # a real training process
def test_a_blocked_loop_keeps_beating_without_progress(platform: Platform) -> None:
    path = platform.rank_file(".heartbeat.json")
    proc = start_script("check_in_then_block.py", platform.env)
    try:
        first = _wait_for_beat(path, lambda b: b["step"] == 3, "the heartbeat of step 3")
        later = _wait_for_beat(path, lambda b: b["written_at"] > first["written_at"] + 0.25,
                               "the heartbeat rewritten while blocked")
    finally:
        proc.send_signal(signal.SIGKILL)  # SIGTERM only asks should_stop(): it would wait
        proc.wait(timeout=10)
    assert later["progress_time"] == first["progress_time"]
    assert later["step"] == 3 and later["pid"] == proc.pid
