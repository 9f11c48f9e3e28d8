"""Graceful stop: SIGTERM sets a flag the loop sees, so it saves and exits 0."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import muster.harness as mh
from tests.harness.conftest import Platform, start_script
from tests.waiting import wait_until


@pytest.mark.lifecycle  # a real training process
def test_sigterm_lets_the_loop_save_and_exit_0(platform: Platform) -> None:
    proc = start_script("stop_on_sigterm.py", platform.env)
    try:
        wait_until(lambda: platform.rank_file(".heartbeat.json").exists(), timeout=20,
                   what="the check-in")
        time.sleep(0.05)  # a few steps in
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, output.decode()
    ack = json.loads(platform.rank_file(".stop-ack.json").read_text())
    checkpoints = list((platform.run_dir / "checkpoints").glob("step-*"))
    assert len(checkpoints) == 1
    saved = json.loads((checkpoints[0] / "state.json").read_text())
    assert ack["step"] == saved["step"] and isinstance(ack["time"], float)
    assert f"stopped at step {saved['step']}".encode() in output


def test_the_flag_is_set_by_sigterm_and_the_handler_given_back(on_platform: Platform) -> None:
    before = signal.getsignal(signal.SIGTERM)
    ack = on_platform.rank_file(".stop-ack.json")
    with mh.init() as ctx:
        ctx.report_training(9, {"loss": 1.0})
        assert not ctx.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_until(ctx.should_stop, timeout=5, what="should_stop() after SIGTERM")
        assert json.loads(ack.read_text())["step"] == 9
        assert ctx.should_stop()  # it stays true
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.lifecycle  # a real training process
def test_a_forked_worker_still_dies_of_sigterm(platform: Platform) -> None:
    proc = start_script("forked_worker.py", platform.env)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output.decode()
    assert b"worker ended by 15\n" in output
    assert b"parent should_stop False\n" in output
