"""A small MLP on scikit-learn's digits, written for Determined's Core API.

Nothing here knows muster: the script imports `determined`, and under muster (`compat:
determined`, which a Determined config like det.yaml gets) that is muster's Core API. It
reads its hyperparameters from the cluster info, resumes from the latest checkpoint, reports
training and validation metrics, saves a checkpoint each epoch with its metadata, and leaves
when preempted (a pause in muster). Off a cluster it trains with the flags' values.

    python3 train.py --epochs 5
"""

from __future__ import annotations

import argparse
import logging
import pathlib
from typing import Any

import determined as det
import torch
from sklearn.datasets import load_digits
from torch import nn

DEFAULTS = {"learning_rate": 0.05, "hidden": 64, "batch_size": 64}
VALIDATION_SHARE = 0.2


def digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and validation images (flattened, scaled to [0, 1]) and labels."""
    data = load_digits()
    images = torch.tensor(data.data, dtype=torch.float32) / 16
    labels = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(order) * (1 - VALIDATION_SHARE))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def build(hparams: dict[str, Any]) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(64, int(hparams["hidden"])), nn.ReLU(),
                          nn.Linear(int(hparams["hidden"]), 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(hparams["learning_rate"]),
                                momentum=0.9)
    return model, optimizer


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                labels: torch.Tensor, batch_size: int, epoch: int,
                core_context: det.core.Context, steps_before: int) -> int:
    """One epoch; the steps completed after it."""
    model.train()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch))
    step = steps_before
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        loss.backward()
        optimizer.step()
        step += 1
        if step % 10 == 0:
            core_context.train.report_training_metrics(steps_completed=step,
                                                       metrics={"loss": loss.item()})
    return step


def validate(model: nn.Module, images: torch.Tensor,
             labels: torch.Tensor) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        logits = model(images)
    return {"validation_loss": nn.functional.cross_entropy(logits, labels).item(),
            "accuracy": (logits.argmax(dim=1) == labels).float().mean().item()}


def load(path: pathlib.Path, model: nn.Module,
         optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """Restore the model and optimizer; the epochs and steps completed."""
    state = torch.load(path / "state.pt")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["epochs"], state["steps"]


def main(core_context: det.core.Context, epochs: int) -> None:
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else DEFAULTS
    train_images, train_labels, val_images, val_labels = digits(seed=0)
    model, optimizer = build(hparams)

    epochs_done, steps = 0, 0
    if info is not None and info.latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            epochs_done, steps = load(path, model, optimizer)
        logging.info("resumed after epoch %d (step %d)", epochs_done, steps)

    for epoch in range(epochs_done, epochs):
        steps = train_epoch(model, optimizer, train_images, train_labels,
                            int(hparams["batch_size"]), epoch, core_context, steps)
        core_context.train.report_validation_metrics(
            steps_completed=steps, metrics=validate(model, val_images, val_labels))
        core_context.train.report_progress((epoch + 1) / epochs)
        metadata = {"steps_completed": steps, "epochs": epoch + 1}
        with core_context.checkpoint.store_path(metadata) as (path, storage_id):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epochs": epoch + 1, "steps": steps}, path / "state.pt")
        logging.info("epoch %d saved as checkpoint %s", epoch + 1, storage_id)
        if core_context.preempt.should_preempt():
            logging.info("preempted after epoch %d", epoch + 1)
            return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    with det.core.init() as core_context:
        main(core_context, args.epochs)
