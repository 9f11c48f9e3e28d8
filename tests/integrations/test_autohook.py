"""`integrations: auto` in real interpreters: `muster.startup` (what a trial's layer runs
first) installs the import hook, which gives a Trainer muster's callback when the framework
is imported, and never breaks a script: not when muster cannot write, not when the script
imports no framework, not when the trial turned integrations off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytorch_lightning", reason="needs the 'examples' extra")

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

SRC = Path(__file__).resolve().parents[2] / "src"
# What a layer's `.pth` does first, then the script as `__main__` (a layer is not needed to
# show what the hook does).
START = "import muster.startup, runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
PL_SCRIPT = """\
import sys
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
trainer = pl.Trainer(max_steps=6, accelerator="cpu", log_every_n_steps=2, logger=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), DataLoader(data, batch_size=8))
print("callbacks:", sorted(type(c).__name__ for c in trainer.callbacks))
print("modules:", "muster.integrations.lightning" in sys.modules)
"""
PLAIN_SCRIPT = """\
import sys
print("modules:", sorted(m for m in sys.modules if m.startswith("muster.integrations")))
"""


def run(tmp_path: Path, script: str, **variables: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "train.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env.update(PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", **variables)
    return subprocess.run([sys.executable, "-c", START, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)


def test_a_pytorch_lightning_trainer_gets_the_callback_without_a_line_changed(
        tmp_path: Path) -> None:
    done = run(tmp_path, PL_SCRIPT, MUSTER_RUN_DIR=str(tmp_path / "run"),
               MUSTER_INTEGRATIONS="auto")

    assert done.returncode == 0, done.stderr
    assert "MusterCallback" in done.stdout
    attempt = tmp_path / "run" / "attempt-1"
    assert json.loads((attempt / "rank-0.heartbeat.json").read_text())["integration"] \
        == "lightning"
    assert json.loads((attempt / "rank-0.plan.json").read_text())["length"] == 6
    steps = [json.loads(line)["step"] for line in
             (attempt / "rank-0.metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6
    # logger=False: the trainer keeps its checkpoints where it would have without muster.
    assert (tmp_path / "checkpoints" / "epoch=1-step=6.ckpt").is_file()
    published = sorted(p.name[:17] for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert published == ["step-000000000005", "step-000000000006"]  # each epoch's end


def test_a_run_directory_muster_cannot_write_leaves_the_script_training(
        tmp_path: Path) -> None:
    blocked = tmp_path / "run"
    blocked.write_text("not a directory")

    done = run(tmp_path, PL_SCRIPT, MUSTER_RUN_DIR=str(blocked), MUSTER_INTEGRATIONS="auto")

    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("muster:")]
    assert len(said) == 1 and "the lightning integration is off" in said[0], said
    assert (tmp_path / "checkpoints" / "epoch=1-step=6.ckpt").is_file()


@pytest.mark.parametrize("integrations", ["auto", ""])
def test_a_script_without_a_framework_never_imports_an_integration(
        tmp_path: Path, integrations: str) -> None:
    done = run(tmp_path, PLAIN_SCRIPT, MUSTER_RUN_DIR=str(tmp_path / "run"),
               MUSTER_INTEGRATIONS=integrations)

    assert done.returncode == 0, done.stderr
    expected = "['muster.integrations', 'muster.integrations.autohook']" if integrations \
        else "[]"
    assert done.stdout.strip() == f"modules: {expected}"


def test_integrations_off_leaves_the_trainer_as_the_script_made_it(tmp_path: Path) -> None:
    done = run(tmp_path, PL_SCRIPT, MUSTER_RUN_DIR=str(tmp_path / "run"))

    assert done.returncode == 0, done.stderr
    assert "MusterCallback" not in done.stdout and "modules: False" in done.stdout
    assert not (tmp_path / "run").exists()
