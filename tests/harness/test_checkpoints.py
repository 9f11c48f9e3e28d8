"""Checkpoints: published whole or not at all; restore returns the latest that verifies."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest

import muster.harness as mh
from muster.errors import MusterError
from tests.harness.conftest import HPARAMS, Platform, fill


def _save(ctx: mh.Context, step: int, payload: bytes, **metadata: object) -> Path:
    with ctx.checkpoint.save(step, metadata=metadata or None) as path:
        (path / "model.bin").write_bytes(payload)
        (path / "optim").mkdir()
        (path / "optim" / "state.bin").write_bytes(payload[::-1])
    restored = ctx.checkpoint.restore()
    assert restored is not None
    return restored.path


def _left_in(checkpoints: Path) -> list[str]:
    return sorted(p.name for p in checkpoints.iterdir()) if checkpoints.exists() else []


def test_a_saved_checkpoint_restores_with_its_metadata(on_platform: Platform) -> None:
    with mh.init() as ctx:
        assert ctx.checkpoint.restore() is None
        with ctx.checkpoint.save(12, metadata={"epoch": 3}) as path:
            assert path.parent == on_platform.run_dir / "checkpoints"
            assert path.name.startswith(".tmp-")
            (path / "model.bin").write_bytes(b"weights")
        found = ctx.checkpoint.restore()
    assert found is not None and ctx.checkpoint.latest() == found
    assert (found.step, found.metadata) == (12, {"epoch": 3})
    assert found.path.parent == on_platform.run_dir / "checkpoints"
    assert found.path.name.startswith("step-000000000012-") and len(found.path.name) == 26
    assert (found.path / "model.bin").read_bytes() == b"weights"
    metadata = json.loads((found.path / "metadata.json").read_text())
    assert metadata == {
        "step": 12, "time": found.time, "trial_id": 7, "attempt": 2, "rank": 1,
        "hparams": HPARAMS, "metadata": {"epoch": 3},
        "files": {"model.bin": hashlib.sha256(b"weights").hexdigest()},
    }
    assert _left_in(on_platform.run_dir / "checkpoints") == [found.path.name]


def test_restore_takes_the_highest_step_then_the_newest(on_platform: Platform) -> None:
    with mh.init() as ctx:
        _save(ctx, 10, b"a")
        _save(ctx, 5, b"b")
        newest = _save(ctx, 10, b"c")
        found = ctx.checkpoint.restore()
    assert found is not None and found.path == newest


@pytest.mark.parametrize("damage", ["flip a byte", "remove a file", "remove metadata.json",
                                    "truncate metadata.json"])
def test_a_corrupt_checkpoint_is_skipped_with_a_warning_naming_it(
    on_platform: Platform, damage: str
) -> None:
    with mh.init() as ctx:
        intact = _save(ctx, 1, b"first")
        corrupt = _save(ctx, 2, b"second")
        _damage(corrupt, damage)
        with pytest.warns(RuntimeWarning, match=f"corrupt checkpoint {corrupt}"):
            found = ctx.checkpoint.restore()
    assert found is not None and found.path == intact


def _damage(checkpoint: Path, damage: str) -> None:
    model = checkpoint / "optim" / "state.bin"
    if damage == "flip a byte":
        data = bytearray(model.read_bytes())
        data[2] ^= 0x01
        model.write_bytes(bytes(data))
    elif damage == "remove a file":
        model.unlink()
    elif damage == "remove metadata.json":
        (checkpoint / "metadata.json").unlink()
    else:
        (checkpoint / "metadata.json").write_text('{"step": 2, "fi')


def test_muster_latest_checkpoint_is_preferred_when_intact(
    on_platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    with mh.init() as ctx:
        chosen = _save(ctx, 1, b"chosen by muster")
        _save(ctx, 2, b"newer")
    monkeypatch.setenv("MUSTER_LATEST_CHECKPOINT", str(chosen))
    with mh.init() as ctx:
        found = ctx.checkpoint.restore()
        assert found is not None and found.path == chosen
        _damage(chosen, "flip a byte")
        with pytest.warns(RuntimeWarning, match=f"corrupt checkpoint {chosen}"):
            fallback = ctx.checkpoint.restore()
    assert fallback is not None and fallback.step == 2


def test_an_exception_in_the_block_leaves_nothing(on_platform: Platform) -> None:
    checkpoints = on_platform.run_dir / "checkpoints"
    with mh.init() as ctx:
        failed = r"step 3 failed inside its save block \(ValueError: half written\)"
        with pytest.raises(mh.CheckpointError, match=failed) as caught, ctx.checkpoint.save(
                3) as path:
            (path / "model.bin").write_bytes(b"half")
            raise ValueError("half written")
        assert isinstance(caught.value, MusterError)
        assert isinstance(caught.value.__cause__, ValueError)
        assert _left_in(checkpoints) == []
        with pytest.raises(KeyboardInterrupt), ctx.checkpoint.save(4):
            raise KeyboardInterrupt  # not wrapped, but cleaned up all the same
        assert _left_in(checkpoints) == []
        assert ctx.checkpoint.restore() is None


def test_what_a_checkpoint_may_not_hold_is_refused(on_platform: Platform) -> None:
    checkpoints = on_platform.run_dir / "checkpoints"
    with mh.init() as ctx:
        reserved = r"metadata\.json is muster's name"
        with pytest.raises(mh.CheckpointError, match=reserved), ctx.checkpoint.save(1) as path:
            (path / "metadata.json").write_text("{}")
        odd = "is not a regular file"
        with pytest.raises(mh.CheckpointError, match=odd), ctx.checkpoint.save(1) as path:
            (path / "link").symlink_to("/etc/hostname")
        with pytest.raises(TypeError, match="JSON-serialisable"), ctx.checkpoint.save(
                1, metadata={"f": object()}):
            pass
    assert _left_in(checkpoints) == []


@pytest.fixture
def full_disk_checkpoints(on_platform: Platform, tiny_disk: Path) -> Path:
    """The trial's checkpoints directory on a 1 MiB file system of its own."""
    checkpoints = on_platform.run_dir / "checkpoints"
    checkpoints.symlink_to(tiny_disk)
    return checkpoints


def test_a_full_disk_while_writing_is_a_checkpoint_error(full_disk_checkpoints: Path) -> None:
    with mh.init() as ctx:
        with pytest.raises(mh.CheckpointError, match="No space left") as caught, \
                ctx.checkpoint.save(5) as path:
            fill(path / "huge.bin")
            with (path / "more.bin").open("wb") as more:
                more.write(b"x" * 65536)  # raises ENOSPC: the disk is full
        assert isinstance(caught.value.__cause__, OSError)
        assert caught.value.__cause__.errno == errno.ENOSPC
        assert _left_in(full_disk_checkpoints) == []


def test_a_full_disk_while_finishing_is_a_checkpoint_error(full_disk_checkpoints: Path) -> None:
    with mh.init() as ctx:
        with pytest.raises(mh.CheckpointError) as caught, ctx.checkpoint.save(6) as path:
            fill(path / "huge.bin")  # the block itself succeeds, to the last byte
        message = str(caught.value)
        assert "Could not save the checkpoint for step 6: writing " in message
        assert "metadata.json failed" in message and "(the disk is full)" in message
        assert isinstance(caught.value.__cause__, OSError)
        assert caught.value.__cause__.errno == errno.ENOSPC
        assert _left_in(full_disk_checkpoints) == []
        assert ctx.checkpoint.restore() is None
    assert os.statvfs(full_disk_checkpoints).f_bfree > 0  # the space came back


def test_a_checkpoint_is_published_only_after_the_counts_it_accounts_for(
    on_platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed right after a checkpoint resumes from it; the samples and metrics of
    the steps inside it must be on disk by then, not a flush interval later."""
    import muster.harness.context as context

    monkeypatch.setattr(context, "FLUSH_INTERVAL_S", 3600.0)  # no background flush here
    attempt = on_platform.run_dir / "attempt-2"
    with mh.init() as ctx:
        ctx.samples.seen(32, epoch=0)
        ctx.report_training(7, {"loss": 0.5})
        assert not (attempt / "rank-1.samples.json").exists()
        with ctx.checkpoint.save(7) as path:
            (path / "model.bin").write_bytes(b"w")
        samples = json.loads((attempt / "rank-1.samples.json").read_text())
        assert samples["epochs"] == {"0": 32}
        lines = (attempt / "rank-1.metrics.jsonl").read_bytes().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [7]
