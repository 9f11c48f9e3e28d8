"""A warm start in the training process: `restore()` hands the experiment's source checkpoint
(MUSTER_SOURCE_CHECKPOINT, another trial's) to a trial that has none of its own, marked as
such; the trial's own checkpoints win as soon as there is one; another trial's checkpoint
found among the trial's own is refused as before (it names another trial)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

import muster.harness as mh
from muster.jobenv import JobEnvironment
from tests.harness.conftest import Platform


def _source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint of step 40 that trial 3 saved in its own run directory."""
    with monkeypatch.context() as other:
        other.setenv("MUSTER_RUN_DIR", str(tmp_path / "trial-3"))
        other.setenv("MUSTER_TRIAL_ID", "3")
        other.delenv("MUSTER_HPARAMS", raising=False)
        with mh.init() as ctx, ctx.checkpoint.save(40, metadata={"epoch": 4}) as path:
            (path / "model.bin").write_bytes(b"trained weights")
    [saved] = (tmp_path / "trial-3" / "checkpoints").iterdir()
    copy = tmp_path / "run" / "source" / saved.name  # where the launch copies it
    shutil.copytree(saved, copy)
    return copy


def test_a_trial_without_checkpoints_gets_the_warm_start(
        on_platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _source(tmp_path, monkeypatch)
    monkeypatch.setenv("MUSTER_SOURCE_CHECKPOINT", str(source))
    with mh.init() as ctx:
        found = ctx.checkpoint.restore()
        assert found is not None and found.warm_start
        assert (found.path, found.step, found.metadata) == (source, 40, {"epoch": 4})
        assert (found.path / "model.bin").read_bytes() == b"trained weights"
        with ctx.checkpoint.save(1) as path:  # its own, of a lower step: it wins
            (path / "model.bin").write_bytes(b"own weights")
        own = ctx.checkpoint.restore()
    assert own is not None and not own.warm_start
    assert (own.step, own.path.parent) == (1, on_platform.run_dir / "checkpoints")


def test_another_trials_checkpoint_among_its_own_is_refused_as_before(
        on_platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The founding false success: a trial that "resumed" from files another trial wrote.
    Only the declared source, outside the trial's checkpoints, is another trial's."""
    source = _source(tmp_path, monkeypatch)
    planted = on_platform.run_dir / "checkpoints" / source.name
    shutil.copytree(source, planted)
    with mh.init() as ctx, pytest.warns(RuntimeWarning, match="names trial 3, but the "
                                        "checkpoint is in trial 7's run directory"):
        assert ctx.checkpoint.restore() is None
    monkeypatch.setenv("MUSTER_SOURCE_CHECKPOINT", str(source))
    with mh.init() as ctx, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the planted one, skipped again
        found = ctx.checkpoint.restore()
    assert found is not None and found.warm_start and found.path == source


def test_a_corrupt_warm_start_is_skipped_with_a_warning(
        on_platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _source(tmp_path, monkeypatch)
    (source / "model.bin").write_bytes(b"changed")
    monkeypatch.setenv("MUSTER_SOURCE_CHECKPOINT", str(source))
    with mh.init() as ctx, pytest.warns(RuntimeWarning, match="skipping the warm start's "
                                        "corrupt checkpoint .*model.bin does not match"):
        assert ctx.checkpoint.restore() is None


def test_the_source_is_a_platform_variable(tmp_path: Path) -> None:
    job = JobEnvironment(run_dir=tmp_path, trial_id=7, source_checkpoint=tmp_path / "source" / "x")
    environ = job.to_environ()
    assert environ["MUSTER_SOURCE_CHECKPOINT"] == str(tmp_path / "source" / "x")
    assert JobEnvironment.from_environ(environ) == job
    # A run without muster never takes it from its environment.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MUSTER_SOURCE_CHECKPOINT", str(tmp_path / "elsewhere"))
        patch.chdir(tmp_path)
        with mh.init() as ctx:
            assert ctx.checkpoint.restore() is None
