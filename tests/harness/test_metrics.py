"""Metrics: checked on each call, buffered, flushed by time and at exit, never torn mid-file."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import muster.harness as mh
from muster.harness.metrics import MetricsWriter
from tests.harness.conftest import Platform, fill, start_script
from tests.waiting import wait_until


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_reports_are_buffered_until_a_flush(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "m.jsonl", rank=3)
    before = time.time()
    writer.report("training", 1, {"loss": 0.5})
    assert (tmp_path / "m.jsonl").read_bytes() == b""
    writer.flush()
    writer.close()
    [line] = _lines(tmp_path / "m.jsonl")
    reported_at = line.pop("time")
    assert line == {"kind": "training", "step": 1, "metrics": {"loss": 0.5}, "rank": 3}
    assert isinstance(reported_at, float) and before - 0.001 <= reported_at <= time.time() + 0.001


def test_the_background_thread_flushes_within_about_a_second(on_platform: Platform) -> None:
    path = on_platform.rank_file(".metrics.jsonl")
    with mh.init() as ctx:
        ctx.report_training(3, {"loss": 0.5})
        lines = wait_until(lambda: path.read_text(), timeout=5, what="the first flush")
        assert json.loads(lines)["step"] == 3


def test_what_is_left_is_flushed_at_exit(on_platform: Platform) -> None:
    with mh.init() as ctx:
        for step in range(1000):
            ctx.report_training(step, {"loss": 1.0})
    assert [line["step"] for line in _lines(on_platform.rank_file(".metrics.jsonl"))] == list(
        range(1000))


def test_nan_and_infinity_are_kept_as_json_tokens(on_platform: Platform) -> None:
    with mh.init() as ctx:
        ctx.report_validation(0, {"nan": math.nan, "inf": math.inf, "neg_inf": -math.inf})
    text = on_platform.rank_file(".metrics.jsonl").read_text()
    assert '"nan": NaN, "inf": Infinity, "neg_inf": -Infinity' in text
    metrics = json.loads(text)["metrics"]
    assert math.isnan(metrics["nan"]) and metrics["inf"] == math.inf


def test_scalars_of_numpy_torch_and_the_stdlib_become_numbers(on_platform: Platform) -> None:
    torch = pytest.importorskip("torch")
    loss = torch.tensor(1.5, requires_grad=True) * 2  # a loss that needs grad: no warning
    with mh.init() as ctx:
        ctx.report_training(np.int64(2), {  # type: ignore[arg-type]
            "loss": loss, "acc": np.float32(0.25), "n": np.int64(3), "zero_d": np.array(0.5),
            "frac": Fraction(1, 4), "big": 10**20, "f64": np.float64(0.1)})
    line = _lines(on_platform.rank_file(".metrics.jsonl"))[0]
    assert line["step"] == 2
    assert line["metrics"] == {"loss": 3.0, "acc": 0.25, "n": 3, "zero_d": 0.5, "frac": 0.25,
                               "big": 10**20, "f64": 0.1}


@pytest.mark.parametrize(
    ("step", "metrics", "error", "message"),
    [
        (-1, {"loss": 1.0}, ValueError, "step must be ≥ 0, got -1"),
        (1.0, {"loss": 1.0}, TypeError, "step must be an int, got float"),
        (True, {"loss": 1.0}, TypeError, "step must be an int, got bool"),
        (1, {"loss": "0.5"}, TypeError, "metric 'loss' must be a number .* got str"),
        (1, {"loss": None}, TypeError, "metric 'loss' must be a number .* got NoneType"),
        (1, {"ok": 1.0, "loss": True}, TypeError, "metric 'loss' is a bool"),
        (1, {"loss": 1 + 2j}, TypeError, "metric 'loss' must be a number .* got complex"),
        (1, {"loss": np.zeros(2)}, TypeError, r"metric 'loss' is a ndarray of shape \(2,\)"),
        (1, {"loss": [1.0]}, TypeError, "metric 'loss' must be a number .* got list"),
        (1, {3: 1.0}, TypeError, "metric names must be str, got int 3"),
        (1, {"": 1.0}, ValueError, "a metric name must be 1 to 128 characters: letters"),
        (1, {"<b>": 1.0}, ValueError, "a metric name must be .*; got '<b>' .*rename it"),
        (1, {}, ValueError, "metrics is empty"),
        (1, [("loss", 1.0)], TypeError, "metrics must be a mapping"),
    ],
)
def test_bad_steps_and_metrics_are_refused_by_name(
    tmp_path: Path, step: object, metrics: object, error: type[Exception], message: str
) -> None:
    writer = MetricsWriter(tmp_path / "m.jsonl", rank=0)
    with pytest.raises(error, match=message):
        writer.report("training", step, metrics)  # type: ignore[arg-type]
    writer.close()
    assert (tmp_path / "m.jsonl").read_bytes() == b""


@pytest.mark.lifecycle  # a real training process
def test_sigkill_mid_run_tears_at_most_the_last_line(platform: Platform) -> None:
    path = platform.rank_file(".metrics.jsonl")
    proc = start_script("report_forever.py", platform.env)
    try:
        # Kill while a later flush may be half written: after the first one, at a moment
        # the test does not choose.
        wait_until(lambda: path.exists() and path.stat().st_size > 0, timeout=20,
                   what="the first flush")
        time.sleep(0.3 + (os.getpid() % 7) / 10)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    *complete, last = path.read_bytes().split(b"\n")
    steps = [json.loads(line)["step"] for line in complete]
    assert steps == list(range(len(steps))) and len(steps) > 0
    # After the last newline there is nothing, or the beginning of the next line: torn.
    next_line = b'{"kind": "training", "step": %d, "metrics": ' % len(steps)
    assert last[:len(next_line)] == next_line[:len(last)]


def test_a_torn_last_line_left_by_a_killed_run_is_cut_off(on_platform: Platform) -> None:
    path = on_platform.rank_file(".metrics.jsonl")
    path.write_bytes(b'{"kind": "training", "step": 0, "metrics": {"a": 1}, "time": 1.0, '
                     b'"rank": 1}\n{"kind": "train')
    with mh.init() as ctx:
        ctx.report_training(1, {"a": 2})
    assert [line["step"] for line in _lines(path)] == [0, 1]


def test_a_failed_write_is_cut_back_and_retried(tiny_disk: Path) -> None:
    path = tiny_disk / "m.jsonl"
    writer = MetricsWriter(path, rank=0)
    fill(tiny_disk / "filler")
    for step in range(8_000):  # ~700 kB of lines: more than is left, less than the disk
        writer.report("training", step, {"loss": 0.5})
    with pytest.raises(OSError, match="No space left"):
        writer.flush()
    assert path.read_bytes() == b""  # the partial write was cut back off
    (tiny_disk / "filler").unlink()
    writer.report("training", 8_000, {"loss": 0.5})
    writer.close()
    assert [line["step"] for line in _lines(path)] == list(range(8_001))
