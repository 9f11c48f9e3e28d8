"""Train a small MLP on the digits PNGs (see prepare_data.py), with muster's harness.

Runs the same under muster and by hand (`python train.py --data data`): off-platform the
harness writes into ./muster-run/. It reports metrics, counts every sample it trains or
validates on, saves a checkpoint each epoch, resumes from the latest intact one, and leaves
cleanly when muster asks it to stop.

Under a searcher (search.yaml) the trial's hyperparameters (`lr`, `hidden`, `dropout`,
`batch_size`) come from `ctx.hparams` and override the flags, and `ctx.max_length` is the
number of epochs: validation is then reported, and each checkpoint saved, with the epoch as
its step, the unit the searcher's `max_length` and its ASHA rungs count in. Without a
searcher the flags decide, and both use the optimizer step, as before. Either way the two
share one unit, and each epoch's checkpoint is saved right after its validation: muster
gives a checkpoint the metric of the validation reported before it, so the "best"
checkpoint it keeps is the model that scored it.

`--skip-corrupt` reproduces a common bug on purpose: the loader skips files it cannot
decode with `except Exception: continue`, so training "succeeds" on part of the data. The
process exits 0; muster's sample check is what notices.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch import nn

import muster.harness as mh

SEARCHED = ("lr", "hidden", "dropout", "batch_size")  # what ctx.hparams may set


class Settings(NamedTuple):
    """What one run trains with: the flags, overridden by the trial's hyperparameters."""

    lr: float
    hidden: int
    dropout: float
    batch_size: int
    epochs: int
    seed: int
    epoch_is_step: bool  # validation and checkpoints are at the epoch (a searcher's unit)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="silently skip files that cannot be decoded (the bug muster catches)")
    return parser.parse_args()


def settings(args: argparse.Namespace, ctx: mh.Context) -> Settings:
    """The flags, with the trial's hyperparameters and the searcher's length on top.

    Off-platform `ctx.hparams` is the flags themselves (see `main`); on the platform it is
    what the config's `hyperparameters` drew ({} without any).
    """
    hparams: Mapping[str, Any] = ctx.hparams
    unknown = sorted(set(hparams) - set(vars(args)) - {"data"})
    if unknown:
        raise ValueError(f"train.py has no hyperparameter {', '.join(unknown)}; "
                         f"it takes {', '.join(SEARCHED)}")
    chosen = {name: hparams.get(name, getattr(args, name)) for name in SEARCHED}
    return Settings(lr=float(chosen["lr"]), hidden=int(chosen["hidden"]),
                    dropout=float(chosen["dropout"]), batch_size=int(chosen["batch_size"]),
                    epochs=ctx.max_length or args.epochs,
                    seed=args.seed if ctx.seed is None else ctx.seed,
                    epoch_is_step=ctx.max_length is not None)


def load_images(root: Path, skip_corrupt: bool) -> tuple[torch.Tensor, torch.Tensor]:
    pixels, labels = [], []
    for path in sorted(root.glob("*/*.png")):
        try:
            with Image.open(path) as image:
                pixels.append(np.asarray(image, dtype=np.float32).reshape(-1) / 255.0)
        except Exception:
            if skip_corrupt:
                continue  # the silent drop: exit code 0, 12% of the data gone
            raise
        labels.append(int(path.parent.name))
    return torch.tensor(np.stack(pixels)), torch.tensor(labels)


def split(x: torch.Tensor, y: torch.Tensor, seed: int) -> tuple[torch.Tensor, ...]:
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(len(x) * 0.8)
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def make_model(hidden: int, dropout: float) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, 10))


def train_epoch(ctx: mh.Context, run: Settings, epoch: int, step: int, model: nn.Module,
                optimizer: torch.optim.Optimizer, data: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[int, float]:
    """One pass over the training set; the last optimizer step and the last batch's loss."""
    x_train, y_train = data
    # Seeded per epoch, so a run resumed from a checkpoint shuffles and drops out exactly as
    # an uninterrupted one would.
    torch.manual_seed(run.seed * 100_003 + epoch)
    model.train()
    order, loss_fn, loss = torch.randperm(len(x_train)), nn.CrossEntropyLoss(), math.nan
    for begin in range(0, len(order), run.batch_size):
        idx = order[begin : begin + run.batch_size]
        optimizer.zero_grad()
        batch_loss = loss_fn(model(x_train[idx]), y_train[idx])
        batch_loss.backward()
        optimizer.step()
        step, loss = step + 1, batch_loss.item()
        ctx.samples.seen(len(idx), epoch=epoch)
        ctx.report_training(step, {"loss": loss})
    return step, loss


def validate(model: nn.Module, x_val: torch.Tensor, y_val: torch.Tensor) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x_val)
        val_loss = nn.functional.cross_entropy(logits, y_val).item()
        accuracy = (logits.argmax(1) == y_val).float().mean().item()
    return val_loss, accuracy


def main() -> int:
    args = parse_args()
    with mh.init(hparams=vars(args) | {"data": str(args.data)}) as ctx:
        run = settings(args, ctx)
        ctx.plan(epochs=run.epochs)  # its planned end: "verified" needs it reached
        print(f"lr {run.lr:.4g}  hidden {run.hidden}  dropout {run.dropout:.2f}  "
              f"batch_size {run.batch_size}  epochs {run.epochs}", flush=True)
        # The split keeps the flag's seed: every trial of a search validates on the same files.
        x_train, y_train, x_val, y_val = split(*load_images(args.data, args.skip_corrupt),
                                               args.seed)
        torch.manual_seed(run.seed)
        model = make_model(run.hidden, run.dropout)
        optimizer = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)
        start, step = 1, 0
        if (latest := ctx.checkpoint.restore()) is not None:
            state = torch.load(latest.path / "state.pt")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            for group in optimizer.param_groups:  # this trial's rate: a PBT member that
                group["lr"] = run.lr  # copied another's checkpoint explores its own
            start, step = state["epoch"] + 1, state.get("step", latest.step)
            print(f"resumed from {latest.path.name} (epoch {state['epoch']})", flush=True)
        print(f"training on {len(x_train)} samples, validating on {len(x_val)}", flush=True)
        for epoch in range(start, run.epochs + 1):
            step, loss = train_epoch(ctx, run, epoch, step, model, optimizer, (x_train, y_train))
            val_loss, accuracy = validate(model, x_val, y_val)
            ctx.samples.seen(len(x_val), epoch=epoch)  # every file is read once per epoch
            mark = epoch if run.epoch_is_step else step  # validation's and the checkpoint's
            ctx.report_validation(mark, {"val_loss": val_loss, "val_accuracy": accuracy})
            print(f"epoch {epoch:3d}  loss {loss:.4f}  val_loss {val_loss:.4f}  "
                  f"val_accuracy {accuracy:.3f}", flush=True)
            with ctx.checkpoint.save(mark, metadata={"epoch": epoch}) as path:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch, "step": step}, path / "state.pt")
            if not math.isfinite(val_loss):
                print(f"training diverged at epoch {epoch}", file=sys.stderr)
                return 1
            # A searcher that stops this trial early (ASHA) sends SIGTERM: the epoch is
            # complete and saved, so leaving now passes muster's checks.
            if ctx.should_stop():
                print(f"stop requested; saved epoch {epoch} and leaving", flush=True)
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
