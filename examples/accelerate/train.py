"""A digits classifier trained with a plain Accelerate loop and muster's tracker.

`MusterTracker` receives what `accelerator.log` logs, and muster's checkpoints stand behind
`accelerator.save_state` / `load_state`: the run resumes from muster's latest checkpoint after
a crash or a pause. Runs anywhere (`python train.py`, `accelerate launch train.py`); off the
platform the harness writes into ./muster-run/.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from muster.integrations.accelerate import MusterTracker


def loaders(batch_size: int) -> tuple[DataLoader, DataLoader]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train, val = order[:1440], order[1440:]
    return (DataLoader(TensorDataset(x[train], y[train]), batch_size=batch_size, shuffle=True),
            DataLoader(TensorDataset(x[val], y[val]), batch_size=256))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    train, val = loaders(args.batch_size)
    tracker = MusterTracker(steps=args.epochs * len(train))
    accelerator = Accelerator(cpu=True, log_with=[tracker])
    accelerator.init_trackers("digits")
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)
    accelerator.register_for_checkpointing(progress := Progress())
    accelerator.load_state()  # muster's latest checkpoint; nothing the first time

    for epoch in range(progress.epoch, args.epochs):
        model.train()
        for x, y in train:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % 10 == 0:
                accelerator.log({"train_loss": loss.item()}, step=progress.step)
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in val)
        accelerator.log({"val_acc": correct / len(val.dataset), "epoch": epoch + 1},
                        step=progress.step)
        progress.epoch = epoch + 1
        accelerator.save_state("checkpoint")
        if tracker.should_stop():
            break
    accelerator.end_training()


class Progress:
    """Where the loop is, saved and restored with the rest of the state."""

    def __init__(self) -> None:
        self.epoch, self.step = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = state["epoch"], state["step"]


if __name__ == "__main__":
    main()
