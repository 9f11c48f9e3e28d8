"""Train a small MLP on the digits PNGs (see prepare_data.py), with muster's harness.

Runs the same under muster and by hand (`python train.py --data data`): off-platform the
harness writes into ./muster-run/. It reports metrics, counts every sample it trains or
validates on, saves a checkpoint each epoch, resumes from the latest intact one, and leaves
cleanly when muster asks it to stop.

`--skip-corrupt` reproduces a common bug on purpose: the loader skips files it cannot
decode with `except Exception: continue`, so training "succeeds" on part of the data. The
process exits 0; muster's sample check is what notices.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

import muster.harness as mh


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="silently skip files that cannot be decoded (the bug muster catches)")
    return parser.parse_args()


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


def main() -> int:
    args = parse_args()
    with mh.init(hparams=vars(args) | {"data": str(args.data)}) as ctx:
        torch.manual_seed(args.seed)
        x_train, y_train, x_val, y_val = split(*load_images(args.data, args.skip_corrupt),
                                               args.seed)
        model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        start, step = 1, 0
        if (latest := ctx.checkpoint.restore()) is not None:
            state = torch.load(latest.path / "state.pt")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start, step = state["epoch"] + 1, latest.step
            print(f"resumed from {latest.path.name} (epoch {state['epoch']})", flush=True)
        print(f"training on {len(x_train)} samples, validating on {len(x_val)}", flush=True)
        for epoch in range(start, args.epochs + 1):
            model.train()
            order = torch.randperm(len(x_train))
            for begin in range(0, len(order), args.batch_size):
                idx = order[begin : begin + args.batch_size]
                optimizer.zero_grad()
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                step += 1
                ctx.samples.seen(len(idx), epoch=epoch)
                ctx.report_training(step, {"loss": loss.item()})
            model.eval()
            with torch.no_grad():
                logits = model(x_val)
                val_loss = loss_fn(logits, y_val).item()
                accuracy = (logits.argmax(1) == y_val).float().mean().item()
            ctx.samples.seen(len(x_val), epoch=epoch)  # every file is read once per epoch
            ctx.report_validation(step, {"val_loss": val_loss, "val_accuracy": accuracy})
            print(f"epoch {epoch:3d}  loss {loss.item():.4f}  val_loss {val_loss:.4f}  "
                  f"val_accuracy {accuracy:.3f}", flush=True)
            with ctx.checkpoint.save(step, metadata={"epoch": epoch}) as path:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, path / "state.pt")
            if not math.isfinite(val_loss):
                print(f"training diverged at epoch {epoch}", file=sys.stderr)
                return 1
            if ctx.should_stop():
                print(f"stop requested; saved epoch {epoch} and leaving", flush=True)
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
