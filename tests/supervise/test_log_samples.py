"""Sample counts from logs (`verify.samples_from_log`): what a pattern counts, bounded lines,
and a pattern that backtracks forever costing one verification, not the server."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from muster.launch.logs import FileLog
from muster.supervise.log_samples import (
    MAX_LINE_BYTES,
    LogSamples,
    bounded_lines,
    count_log_samples,
    counts_in,
)

WITH_EPOCH = re.compile(r"epoch (?P<epoch>\d+) .*samples=(?P<samples>\d+)")
WITHOUT_EPOCH = re.compile(r"trained on (?P<samples>\S+) samples")


@pytest.mark.parametrize(("pattern", "log", "expected"), [
    (WITH_EPOCH, b"epoch 0 done samples=900\nepoch 0 done samples=897\nepoch 1 x samples=1797\n",
     LogSamples({0: 1797, 1: 1797}, 3)),
    (WITHOUT_EPOCH, b"trained on 1797 samples\nnoise\ntrained on 1581 samples\n",
     LogSamples({0: 1797, 1: 1581}, 2)),
    (WITHOUT_EPOCH, b"trained on many samples\ntrained on -3 samples\ntrained on \xb2 samples\n",
     LogSamples({}, 0, unusable=3)),
    (WITH_EPOCH, b"nothing to see\n\xff\xfe binary\n", LogSamples({}, 0)),
])
def test_what_a_pattern_counts(pattern: re.Pattern[str], log: bytes,
                               expected: LogSamples) -> None:
    assert counts_in(bounded_lines(io.BytesIO(log)), pattern) == expected


def test_a_line_without_an_end_is_read_in_bounded_pieces() -> None:
    lines = list(bounded_lines(io.BytesIO(b"x" * (3 * MAX_LINE_BYTES + 5) + b"\nlast\n")))
    assert [len(line) for line in lines] == [MAX_LINE_BYTES] * 3 + [6, 5]


@pytest.mark.lifecycle  # a child process counts
def test_a_log_is_counted_by_a_child_process(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"".join(b"epoch %d step 9 samples=%d\n" % (e, 100 + e) for e in range(500)))
    counted = count_log_samples(FileLog(0, path), WITH_EPOCH.pattern)
    assert counted == LogSamples({e: 100 + e for e in range(500)}, 500)
    assert count_log_samples(FileLog(0, tmp_path / "missing.log"), WITH_EPOCH.pattern) == (
        LogSamples({}, 0))


@pytest.mark.lifecycle
@pytest.mark.timeout(30)
def test_a_pattern_that_backtracks_forever_is_stopped(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"a" * 40 + b"\n")
    counted = count_log_samples(FileLog(0, path), r"(?P<samples>(a+)+)b", timeout=1.0)
    assert counted.by_epoch == {} and counted.problem is not None
    assert counted.problem == "counting took longer than 1 s (does the pattern backtrack?)"


@pytest.mark.lifecycle
@pytest.mark.timeout(60)
def test_the_child_ends_by_itself_when_its_parent_is_gone() -> None:
    """A counting child outlives a killed server only for its CPU limit (an orphaned one
    once spun for 20 minutes): the kernel stops it."""
    child = subprocess.run(
        [sys.executable, "-P", "-m", "muster.supervise.log_samples", r"(?P<samples>(a+)+)b",
         "1"], input=b"a" * 40 + b"\n", capture_output=True, check=False)
    assert child.returncode in (-signal.SIGXCPU, -signal.SIGKILL), child
