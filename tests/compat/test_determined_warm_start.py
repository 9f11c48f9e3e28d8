"""Determined's warm start (`searcher.source_trial_id`, `source_checkpoint_uuid`) in muster's
Core API: a trial without a checkpoint of its own finds the experiment's source as
`get_cluster_info().latest_checkpoint`, and `restore_path` opens it; its own win once there.
In this process (`StorageIds`); a whole run is in tests/services/test_warm_starts.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from muster import checkpoint_files, harness
from muster.compat.determined.core._storage_ids import STORAGE_ID_KEY, StorageIds

SOURCE_ID = "step-000000000005-" + "a" * 32
OWN_ID = "step-000000000002-" + "b" * 32


def _saved(run_dir: Path, trial_id: str, monkeypatch: pytest.MonkeyPatch,
           storage_id: str = SOURCE_ID) -> Path:
    """A checkpoint that trial `trial_id` saved through the Core API, as `storage_id`."""
    with monkeypatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("MUSTER_")]:
            patch.delenv(name)
        patch.setenv("MUSTER_RUN_DIR", str(run_dir))
        patch.setenv("MUSTER_TRIAL_ID", trial_id)
        step = checkpoint_files.step_in_name(storage_id)
        assert step is not None
        with harness.init() as ctx, ctx.checkpoint.save(step, {STORAGE_ID_KEY: storage_id}) \
                as path:
            (path / "model").write_text(f"weights of trial {trial_id}")
    assert ctx.checkpoint.last_saved is not None
    return ctx.checkpoint.last_saved


def test_the_source_is_the_latest_checkpoint_until_the_trial_has_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _saved(tmp_path / "trial-3", "3", monkeypatch)
    own = tmp_path / "trial-7" / "checkpoints"
    ids = StorageIds(own, None, 7, source)

    assert ids.latest() == SOURCE_ID
    assert ids.find(SOURCE_ID).path == source  # what restore_path opens

    mine = _saved(tmp_path / "trial-7", "7", monkeypatch, OWN_ID)  # a lower step: it wins
    ids = StorageIds(own, None, 7, source)
    assert ids.latest() == OWN_ID and ids.find(OWN_ID).path == mine


def test_another_trials_checkpoint_among_its_own_is_not_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _saved(tmp_path / "trial-3", "3", monkeypatch)
    own = tmp_path / "trial-7" / "checkpoints"
    own.mkdir(parents=True)
    shutil.copytree(source, own / source.name)

    with pytest.warns(RuntimeWarning, match="names trial 3"):
        assert StorageIds(own, None, 7).latest() is None
    with pytest.warns(RuntimeWarning, match="names trial 3"):
        assert StorageIds(own, None, 7, source).latest() == SOURCE_ID
