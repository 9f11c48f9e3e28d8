"""`reproducibility.deterministic: true`: every rank gets PYTHONHASHSEED=0 and
CUBLAS_WORKSPACE_CONFIG, the harness seeds and switches torch to deterministic algorithms,
and the digits example run twice with the same seed ends with bit-identical weights and
metrics (so it does without the switch on this CPU: docs/config.md says so)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.services.experiments import create_experiment
from muster.services.metrics import list_metrics
from muster.store import Checkpoint, Trial
from tests.supervise.conftest import Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
PROBE = """
import os, random, muster.harness as mh
with mh.init() as ctx:
    import torch
    print("probe", os.environ.get("PYTHONHASHSEED"), os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
          torch.are_deterministic_algorithms_enabled(), torch.initial_seed(),
          random.random() == random.Random(ctx.seed + ctx.rank).random(), flush=True)
"""


def _run(rig: Rig, config: dict[str, Any], context: Path | None = None) -> int:
    archive = None
    if context is not None:
        archive = tmp_archive(context)
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=archive)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    trial = rig.run_to_end_of(experiment_id, trial_id)
    assert trial.state == "SUCCEEDED", trial
    return trial_id


def tmp_archive(context: Path) -> Path:
    made = shutil.make_archive(str(context.parent / f"{context.name}-archive"), "gztar",
                               root_dir=context)
    return Path(made)


def test_every_rank_is_seeded_and_deterministic(sqlite_rig: Rig) -> None:
    trial_id = _run(sqlite_rig, {
        "name": "det", "harness": True, "entrypoint": [sys.executable, "-c", PROBE],
        "verify": {"require_checkpoint": False},
        "resources": {"replicas": 2},
        "reproducibility": {"experiment_seed": 7, "deterministic": True}})
    with sqlite_rig.store.session_scope() as s:
        trial = s.get_one(Trial, trial_id)
        attempt_dir = Path(trial.attempts[-1].run_dir)
    torch_seeds = set()
    for rank in (0, 1):
        line = next(x for x in (attempt_dir / f"rank-{rank}.log").read_text().splitlines()
                    if x.startswith("probe"))
        _, hashseed, workspace, deterministic, torch_seed, python_seeded = line.split()
        assert (hashseed, workspace, deterministic, python_seeded) == (
            "0", ":4096:8", "True", "True")
        torch_seeds.add(torch_seed)
    assert len(torch_seeds) == 1  # the same torch seed on every rank: the same model


def _digits(sqlite_rig: Rig, tmp_path: Path, deterministic: bool) -> tuple[str, list[Any]]:
    context = tmp_path / f"digits-{deterministic}-{len(list(tmp_path.iterdir()))}"
    context.mkdir()
    shutil.copy2(EXAMPLE / "train.py", context / "train.py")
    shutil.copytree(tmp_path / "data", context / "data")
    config = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())
    config["entrypoint"] = config["entrypoint"].replace("--epochs 15", "--epochs 2")
    config["reproducibility"] = {"experiment_seed": 1234, "deterministic": deterministic}
    trial_id = _run(sqlite_rig, config, context)
    with sqlite_rig.store.session_scope() as s:
        latest = s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial_id)
                           .order_by(Checkpoint.step.desc())).first()
        assert latest is not None
        path = Path(latest.path)
    weights = _weights_digest(path / "state.pt")
    metrics = [(m["step"], m["metrics"]) for m in list_metrics(
        sqlite_rig.store, trial_id, kind="validation")]
    return weights, metrics


def _weights_digest(state_file: Path) -> str:
    code = ("import hashlib, sys, torch; s = torch.load(sys.argv[1]); h = hashlib.sha256(); "
            "[h.update(k.encode() + v.numpy().tobytes()) for k, v in sorted(s['model'].items())]"
            "; print(h.hexdigest())")
    done = subprocess.run([sys.executable, "-c", code, str(state_file)], capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.strip()


def test_the_digits_example_twice_gives_bit_identical_weights_and_metrics(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(EXAMPLE / "prepare_data.py"), "--out",
                    str(tmp_path / "data")], capture_output=True, timeout=120, check=True)
    first = _digits(sqlite_rig, tmp_path, deterministic=True)
    second = _digits(sqlite_rig, tmp_path, deterministic=True)
    assert first == second and len(first[1]) == 2
    assert len(first[0]) == 64  # a sha256 of the final weights
    plain = _digits(sqlite_rig, tmp_path, deterministic=False)
    assert plain == first  # on this CPU, one thread, the example's own seeding suffices
