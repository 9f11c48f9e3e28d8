"""Train a small MLP on scikit-learn's bundled digits data (no download needed).

Runs the same under muster (`muster experiment create digits.yaml .`) and by hand
(`python train.py`). It prints one line per epoch and exits non-zero if training diverges,
so a bad run never looks like a good one.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def load_data(seed: int) -> tuple[torch.Tensor, ...]:
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_val, y_train, y_val = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return x_train, x_val, y_train, y_val


def main() -> int:
    args = parse_args()
    torch.manual_seed(args.seed)
    x_train, x_val, y_train, y_val = load_data(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    print(f"training on {len(x_train)} samples, validating on {len(x_val)}", flush=True)
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train))
        total = 0.0
        for start in range(0, len(order), args.batch_size):
            idx = order[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        train_loss = total / len(x_train)
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
            val_loss = loss_fn(logits, y_val).item()
            accuracy = (logits.argmax(1) == y_val).float().mean().item()
        print(f"epoch {epoch:3d}  train_loss {train_loss:.4f}  val_loss {val_loss:.4f}  "
              f"val_accuracy {accuracy:.3f}", flush=True)
        if not math.isfinite(train_loss):
            print(f"training diverged at epoch {epoch} (loss {train_loss})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
