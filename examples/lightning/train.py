"""A digits classifier in PyTorch Lightning, written the way Lightning's own examples are.

Nothing here imports muster: run under muster with `integrations: auto` (the default for a
script without `harness: true`), the trial's import hook gives the Trainer muster's
callback: planned length, metrics, samples, checkpoints, resume and stops come from
Lightning's own state. `--muster-callback` adds the callback by hand instead, as a script
that wants it explicit would (`integrations: off` in lightning-explicit.yaml).

    python train.py --epochs 4                  # anywhere: plain Lightning
    torchrun --nproc-per-node 2 train.py        # 2 ranks, DDP on gloo
"""

from __future__ import annotations

import argparse
import os

import lightning as L
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DigitsClassifier(L.LightningModule):
    def __init__(self, hidden: int = 64, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor],
                      batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class DigitsData(L.LightningDataModule):
    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16
        y = torch.tensor(digits.target)
        generator = torch.Generator().manual_seed(0)
        order = torch.randperm(len(y), generator=generator)
        self.train, self.val = (TensorDataset(x[order[:1440]], y[order[:1440]]),
                                TensorDataset(x[order[1440:]], y[order[1440:]]))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--muster-callback", action="store_true",
                        help="add muster's callback by hand (muster.integrations.lightning)")
    args = parser.parse_args()

    callbacks = []
    if args.muster_callback:
        from muster.integrations.lightning import MusterCallback

        callbacks.append(MusterCallback())
    # Under torchrun (or muster's replicas), one process per rank: Lightning joins them.
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    L.seed_everything(0)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=ranks,
                        strategy="ddp" if ranks > 1 else "auto", log_every_n_steps=10,
                        enable_progress_bar=False, callbacks=callbacks)
    trainer.fit(DigitsClassifier(lr=args.lr), datamodule=DigitsData(args.batch_size))


if __name__ == "__main__":
    main()
