"""The drill's "nan" fault: the server asks (muster.drill.inject.request_nan), a real training
script's harness makes its next reported loss NaN (muster.harness.drill_nan), and the
metrics file holds it for verification to see."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from muster.drill.inject import request_nan
from muster.errors import InjectionError
from muster.harness.drill_nan import NanRequest, loss_name
from muster.harness.metrics import MetricsWriter
from muster.metrics_lines import parse
from muster.rundir import RunDir
from tests.launch.conftest import fixture_argv
from tests.waiting import wait_until


@pytest.mark.parametrize(("metrics", "name"), [
    ({"acc": 0.9, "loss": 0.5, "val_loss": 0.7}, "loss"),
    ({"acc": 0.9, "train/Loss_step": 0.5, "val_loss": 0.7}, "train/Loss_step"),
    ({"acc": 0.9, "lr": 0.1}, "acc"),
    ({"note": "text", "epoch": 3}, "epoch"),
    ({"flag": True, "lr": 0.1}, "lr"),
    ({}, None),
])
def test_the_loss_a_drill_makes_nan(metrics: dict[str, object], name: str | None) -> None:
    assert loss_name(metrics) == name


def test_a_request_is_applied_to_one_report_then_recorded(tmp_path: Path) -> None:
    files = RunDir(tmp_path).attempt(1).rank(0)
    files.attempt_dir.mkdir(parents=True)
    nan = NanRequest(files)
    writer = MetricsWriter(files.metrics, 0, nan)
    nan.check()
    assert not nan.armed  # nothing asked yet
    request_nan(files.attempt_dir, 0)
    nan.check()
    writer.report("validation", 4, {"acc": 0.5, "val_loss": 0.25})
    writer.report("validation", 5, {"acc": 0.5, "val_loss": 0.25})
    nan.check()
    writer.close()
    nan.check()  # again: nothing more
    lines = [parse(line, 0) for line in files.metrics.read_bytes().splitlines(keepends=True)]
    assert [(m.step, m.metrics["acc"], math.isnan(m.metrics["val_loss"]))
            for m in lines if m is not None] == [(4, 0.5, True), (5, 0.5, False)]
    assert json.loads(files.drill_nan_done.read_text()) == {
        "step": 4, "metric": "val_loss", "kind": "validation"}
    assert not files.drill_nan.exists()


def test_off_the_platform_no_request_is_looked_for(tmp_path: Path) -> None:
    files = RunDir(tmp_path).attempt(1).rank(0)
    files.attempt_dir.mkdir(parents=True)
    request_nan(files.attempt_dir, 0)
    nan = NanRequest(None)
    nan.check()
    assert not nan.armed and files.drill_nan.exists()


def test_a_request_needs_the_attempt_directory(tmp_path: Path) -> None:
    with pytest.raises(InjectionError, match="does not exist"):
        request_nan(tmp_path / "attempt-1", 0)


@pytest.mark.lifecycle
@pytest.mark.timeout(60)
def test_a_running_script_reports_one_nan_loss(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    attempt = run.attempt(1)
    attempt.path.mkdir(parents=True)
    attempt.hparams.write_text("{}")
    env = {**os.environ, "MUSTER_RUN_DIR": str(run.path), "MUSTER_TRIAL_ID": "1",
           "MUSTER_ATTEMPT": "1", "MUSTER_HPARAMS": str(attempt.hparams), "RANK": "0",
           "WORLD_SIZE": "1"}
    until = tmp_path / "finish"
    argv = fixture_argv("harness_train.py", "--until", str(until), "--pause", "0.01",
                        "--no-checkpoint")
    files = attempt.rank(0)
    with subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT) as script:
        try:
            wait_until(lambda: files.metrics.exists() and files.metrics.stat().st_size,
                       timeout=30, what="the first metrics")
            request_nan(attempt.path, 0)
            wait_until(files.drill_nan_done.exists, timeout=10,
                       what="the harness to apply the request")
            until.touch()
            output, _ = script.communicate(timeout=30)
        finally:
            script.kill()
    assert script.returncode == 0, output.decode(errors="replace")
    record = json.loads(files.drill_nan_done.read_text())
    lines = [parse(line, 0) for line in files.metrics.read_bytes().splitlines(keepends=True)]
    nan_steps = [(m.kind.value, m.step) for m in lines
                 if m is not None and any(math.isnan(v) for v in m.metrics.values())]
    assert nan_steps == [("training", record["step"])]
    assert record["metric"] == "loss" and record["kind"] == "training"
    assert b'"loss": NaN' in files.metrics.read_bytes()
    assert not files.drill_nan.exists()
