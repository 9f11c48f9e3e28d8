"""A small digits search (examples/digits/search.yaml's script and space, fewer and shorter
trials), run for real and collected by GC: the checkpoint muster keeps as the best trial's
best is the model that scored the metric muster shows for it (issue 30, item 11), and no
checkpoint GC deleted had a better metric than a trial's kept best.

The kept checkpoint is loaded with torch and validated as train.py validates; its accuracy
must equal what muster attributed to it. Before the fix, muster matched checkpoints
(optimizer steps 45, 90, ...) to validations (epochs 1, 2, ...) by step number.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from muster.checkpoint_storage.worker import StorageWorker
from muster.client import pack_context
from muster.services.experiments import create_experiment, describe_experiment
from muster.services.retention import trial_checkpoints
from tests.checkpoint_storage.test_worker import _drain
from tests.examples.test_ddp import EXAMPLE, NEEDS, copy_context, digits
from tests.supervise.conftest import Rig

torch = pytest.importorskip("torch", reason=NEEDS)
pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(400)]

__all__ = ["digits"]  # the module's PNG files, made once
SEARCH_TIMEOUT = 300.0


def _train_module() -> ModuleType:
    """examples/digits/train.py, imported under its own name (its split, model, validate)."""
    spec = importlib.util.spec_from_file_location("digits_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _small_search(storage: Path) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((EXAMPLE / "search.yaml").read_text())
    config["searcher"] = {"name": "random", "metric": "val_accuracy",
                          "smaller_is_better": False, "max_trials": 3,
                          "max_concurrent_trials": 2, "max_length": 6}
    config["checkpoint_storage"] = {"type": "shared_fs", "path": str(storage),
                                    "save_trial_best": 1, "save_trial_latest": 1}
    config["failure_policy"]["heartbeat_timeout"] = "200s"
    return config


def _submit(rig: Rig, config: dict[str, Any], context: Path) -> int:
    archive = context.with_name("context.tar.gz")
    archive.write_bytes(pack_context(context))
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config), archive)


def _accuracy(train: ModuleType, checkpoint: Path, hparams: dict[str, Any],
              val: tuple[Any, Any]) -> float:
    """The checkpoint's model validated as train.py validates it."""
    state = torch.load(checkpoint / "state.pt")
    model = train.make_model(int(hparams["hidden"]), float(hparams["dropout"]))
    model.load_state_dict(state["model"])
    _, accuracy = train.validate(model, *val)
    return float(accuracy)


def test_the_kept_best_checkpoint_of_the_best_trial_scores_the_metric_muster_shows(
    sqlite_rig: Rig, tmp_path: Path, digits: Path
) -> None:
    context = copy_context(tmp_path, digits, ("train.py",))
    experiment_id = _submit(sqlite_rig, _small_search(tmp_path / "storage"), context)
    sqlite_rig.tick_until(lambda: sqlite_rig.experiment_state(experiment_id).is_terminal(),
                          what="the digits search to end", timeout=SEARCH_TIMEOUT)
    experiment = describe_experiment(sqlite_rig.store, experiment_id)
    assert experiment["state"] == "COMPLETED", experiment
    assert all(t["state"] == "SUCCEEDED" for t in experiment["trials"]), experiment["trials"]
    worker = StorageWorker(sqlite_rig.store, sqlite_rig.home)
    worker.recover()
    _drain(worker)

    best = experiment["search"]["best"]
    rows = trial_checkpoints(sqlite_rig.store, best["trial_id"]).rows
    kept_best = [c for c in rows if c["state"] != "deleted"
                 and "best 1" in (c["kept_because"] or "")]
    assert len(kept_best) == 1, rows
    kept = kept_best[0]
    assert kept["metric"] == best["value"] and kept["step"] == kept["metric_step"], kept

    train = _train_module()
    _, _, x_val, y_val = train.split(*train.load_images(context / "data", False), 0)
    scored = _accuracy(train, Path(kept["path"]), best["hparams"], (x_val, y_val))
    assert math.isclose(scored, kept["metric"], abs_tol=1e-6), (scored, kept)

    for trial in experiment["trials"]:
        listed = trial_checkpoints(sqlite_rig.store, trial["id"]).rows
        best_kept = [c["metric"] for c in listed if c["state"] != "deleted"
                     and "best 1" in (c["kept_because"] or "")]
        deleted = [c["metric"] for c in listed if c["state"] == "deleted"]
        assert len(best_kept) == 1 and None not in deleted, listed
        assert all(value <= best_kept[0] for value in deleted), listed
