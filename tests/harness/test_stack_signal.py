"""The harness's stacks on a signal: registered for the block, printed on SIGUSR2, given
back at its end, and never taken from a script that handles the signal itself."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import muster.harness as mh
from muster.harness.stack_signal import SIGNAL, read_registration
from muster.rundir import RunDir


def _caught(signum: int) -> bool:
    """Whether this process handles `signum` (SigCgt in /proc/self/status)."""
    status = Path("/proc/self/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def test_the_block_prints_every_stack_on_the_signal_and_gives_it_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    files = RunDir(tmp_path / "muster-run").attempt(1).rank(0)
    with mh.init():
        registration = read_registration(files.stack_signal)
        assert registration is not None
        assert (registration.pid, registration.signum) == (os.getpid(), SIGNAL)
        stat = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        assert registration.start_ticks == int(stat[19])
        assert _caught(SIGNAL)
        os.kill(os.getpid(), SIGNAL)
        printed = files.faulthandler.read_text()
        assert "Current thread" in printed
        assert "test_the_block_prints_every_stack_on_the_signal" in printed
    assert not files.stack_signal.exists() and not _caught(SIGNAL)
    assert files.faulthandler.exists()  # what it printed stays


def test_an_unused_output_file_goes_with_the_block(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    files = RunDir(tmp_path / "muster-run").attempt(1).rank(0)
    with mh.init():
        assert files.faulthandler.exists()
    assert not files.faulthandler.exists() and not files.stack_signal.exists()


def test_a_scripts_own_handler_is_left_alone(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    seen: list[int] = []
    previous = signal.signal(SIGNAL, lambda signum, frame: seen.append(signum))
    try:
        files = RunDir(tmp_path / "muster-run").attempt(1).rank(0)
        with mh.init():
            assert not files.stack_signal.exists()
            os.kill(os.getpid(), SIGNAL)
        assert seen == [SIGNAL]
    finally:
        signal.signal(SIGNAL, previous)


@pytest.mark.parametrize("content", [
    '{"pid": 1, "start_ticks": 2}', '{"pid": true, "start_ticks": 2, "signal": 12}',
    '{"pid": -4, "start_ticks": 2, "signal": 12}', "[]", "not json"])
def test_a_malformed_registration_is_none(tmp_path: Path, content: str) -> None:
    path = tmp_path / "registration.json"
    path.write_text(content)
    assert read_registration(path) is None
