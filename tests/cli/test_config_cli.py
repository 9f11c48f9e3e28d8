"""`muster config from-determined FILE`: the muster config a Determined config maps to on
stdout, what each key became on stderr; exit 2, with the reason, for anything else. Run as
a real subprocess, without a server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from muster.config.loading import read_experiment_config

pytestmark = pytest.mark.lifecycle  # starts real processes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def from_determined(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "muster", "config", "from-determined",
                           str(path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8"})


def test_it_prints_the_muster_config_and_each_keys_line() -> None:
    path = FIXTURES / "determined_configs" / "core_api_mnist_distributed.yaml"
    done = from_determined(path)
    assert done.returncode == 0, done.stderr
    printed = read_experiment_config(done.stdout, "stdout")
    assert printed.translation is None  # muster's own config, to keep and edit
    assert printed.config == read_experiment_config(path.read_text(), "det").config
    assert done.stdout.startswith(f"# muster's config for {path}, a Determined experiment "
                                  "config\n")
    lines = done.stderr.splitlines()
    assert lines[0] == f"{path}: a Determined experiment config, read as muster's:"
    assert "  resources.slots_per_trial: 4 → resources.replicas: 4, gpus_per_replica: 1 (" \
           "determined.launch.torch_distributed starts a process per slot;" in done.stderr
    assert any(line.startswith("  records_per_epoch: ignored: ") for line in lines)


@pytest.mark.parametrize(("path", "says"), [
    (ROOT / "examples" / "digits" / "experiment.yaml",
     "is not a Determined experiment config: it has keys only muster has (harness, verify"),
    (FIXTURES / "exit0.sh", "is not a Determined experiment config: it is not a mapping"),
    (FIXTURES / "determined_configs" / "missing.yaml", "cannot read the config file"),
])
def test_anything_else_exits_2_with_the_reason(path: Path, says: str) -> None:
    done = from_determined(path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("error: ") and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_config_muster_cannot_run_exits_2_naming_each_problem(tmp_path: Path) -> None:
    path = tmp_path / "trial.yaml"
    path.write_text("name: mnist\nentrypoint: model_def:MNistTrial\nmax_restarts: 0\n"
                    "checkpoint_storage: {type: s3, bucket: ckpt, secret_key: s3cr3t, "
                    "access_key: AKIA}\n")
    done = from_determined(path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines()[:4] == [
        f"error: {path}: invalid Determined experiment config:",
        "entrypoint: 'model_def:MNistTrial' is a Determined Trial class; muster runs scripts, "
        "not Trial classes: train in a script with Determined's Core API (`with "
        "det.core.init() as core_context: ...`, run as `entrypoint: python3 train.py`: muster "
        "gives it its own Core API as `determined`), or one that calls muster.harness",
        "checkpoint_storage.secret_key: a key written in the config would be stored and shown "
        "with it (muster keeps the config as it was submitted): remove it, and let the server "
        "use boto3's default credentials (its environment, ~/.aws, an instance role), or "
        "write where it reads the key: env:NAME or file:/path",
        "checkpoint_storage.access_key: a key written in the config would be stored and shown "
        "with it (muster keeps the config as it was submitted): remove it, and let the server "
        "use boto3's default credentials (its environment, ~/.aws, an instance role), or "
        "write where it reads the key: env:NAME or file:/path",
    ]
