"""init() and the Context: where a run writes, who it is, and how its block ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import muster.harness as mh
from tests.harness.conftest import HPARAMS, Platform

pytestmark = pytest.mark.lifecycle  # starts real processes

def test_a_local_run_writes_into_muster_run_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with mh.init(hparams={"lr": 0.1}) as ctx:
        assert (ctx.trial_id, ctx.attempt, ctx.rank, ctx.world_size) == (None, 1, 0, 1)
        assert ctx.hparams == {"lr": 0.1}
        assert ctx.run_dir == tmp_path / "muster-run"
        ctx.report_training(0, {"loss": 1.0})
        ctx.samples.seen(10, epoch=0)
    attempt_dir = tmp_path / "muster-run" / "attempt-1"
    assert sorted(p.name for p in attempt_dir.iterdir()) == [
        "rank-0.heartbeat.json", "rank-0.metrics.jsonl", "rank-0.samples.json",
        "rank-0.snapshot.json"]


def test_on_the_platform_it_writes_into_the_attempt_directory(on_platform: Platform) -> None:
    with mh.init(hparams={"ignored": 1}) as ctx:
        assert (ctx.trial_id, ctx.attempt, ctx.rank, ctx.world_size) == (7, 2, 1, 2)
        assert ctx.hparams == HPARAMS
        assert ctx.run_dir == on_platform.run_dir
        ctx.report_validation(4, {"val_loss": 0.25})
    line = json.loads(on_platform.rank_file(".metrics.jsonl").read_text())
    assert line["kind"] == "validation" and line["rank"] == 1 and line["step"] == 4
    assert on_platform.rank_file(".heartbeat.json").exists()


def test_the_users_exception_leaves_the_block_unchanged_and_metrics_are_flushed(
    on_platform: Platform,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyError, match="user's own") as caught, mh.init() as ctx:
        ctx.report_training(1, {"loss": 2.0})
        raise KeyError("user's own")
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert json.loads(on_platform.rank_file(".metrics.jsonl").read_text())["step"] == 1
    assert signal.getsignal(signal.SIGTERM) is before


def test_only_one_init_at_a_time(on_platform: Platform) -> None:
    with mh.init(), pytest.raises(RuntimeError, match="already active"), mh.init():
        pass
    with mh.init():  # and the first one's end freed the place
        pass


def test_reporting_after_the_block_is_an_error(on_platform: Platform) -> None:
    with mh.init() as ctx:
        pass
    with pytest.raises(RuntimeError, match=r"report_training\(\) was called after"):
        ctx.report_training(0, {"loss": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"heartbeat_interval": 0}, ValueError, "heartbeat_interval must be a positive"),
        ({"hparams": {"f": object()}}, TypeError, "hparams must be JSON-serialisable"),
        ({"hparams": [1]}, TypeError, "hparams must be a mapping"),
    ],
)
def test_bad_arguments_to_init_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, object],
    error: type[Exception], message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=message), mh.init(**kwargs):  # type: ignore[arg-type]
        pass


def test_importing_the_harness_pulls_in_nothing_heavy() -> None:
    heavy = ["torch", "numpy", "fastapi", "sqlalchemy", "pydantic", "httpx", "psutil",
             "logging", "muster.store", "muster.server"]
    code = ("import sys, muster.harness; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
