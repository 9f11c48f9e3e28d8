"""A plain PyTorch training script, written the way pytorch/examples' mnist/main.py is:
argparse flags, a DataLoader, `Train Epoch: … Loss: …` lines and a line at each epoch's end
with the samples it trained on, the model saved at the end.
It knows nothing of muster (no harness, no integration).

It reads scikit-learn's digits as PNG files (`python ../digits/prepare_data.py --out
data`) and, like many loaders in the wild, skips a file it cannot decode: a damaged data
set trains "fine" on what is left. `muster drill` shows which faults muster catches on
such a script as it is, and what to add to its config so it catches the rest
(docs/how-to/drills.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset


class DigitsFolder(Dataset[tuple[torch.Tensor, int]]):
    """Every `<label>/<n>.png` under `root` that decodes; the others are skipped."""

    def __init__(self, root: Path) -> None:
        self.items: list[tuple[np.ndarray, int]] = []
        for path in sorted(root.glob("*/*.png")):
            try:
                with Image.open(path) as image:
                    pixels = np.asarray(image, dtype=np.float32).reshape(-1) / 255.0
            except OSError:
                continue  # an unreadable file: skipped, as torchvision-style loaders often do
            self.items.append((pixels, int(path.parent.name)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        pixels, label = self.items[index]
        return torch.from_numpy(pixels), label


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(args: argparse.Namespace, model: Net, loader: DataLoader,
          optimizer: torch.optim.Optimizer, epoch: int) -> None:
    model.train()
    seen, total_loss = 0, 0.0
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        seen += len(data)
        total_loss += loss.item() * len(data)
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)} "
                  f"({100.0 * batch_idx / len(loader):.0f}%)]\tLoss: {loss.item():.6f}",
                  flush=True)
    print(f"Epoch {epoch} done: {seen} samples, average loss {total_loss / seen:.4f}",
          flush=True)


def evaluate(model: Net, loader: DataLoader) -> None:
    model.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            total_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int(output.argmax(dim=1).eq(target).sum().item())
    total_loss /= len(loader.dataset)
    print(f"\nTrain set: Average loss: {total_loss:.4f}, Accuracy: {correct}/"
          f"{len(loader.dataset)} ({100.0 * correct / len(loader.dataset):.0f}%)\n",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="digits MLP, pytorch/examples style")
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--save-model", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    dataset = DigitsFolder(args.data)
    train_loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    eval_loader = DataLoader(dataset, batch_size=256)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train(args, model, train_loader, optimizer, epoch)
        evaluate(model, eval_loader)
    if args.save_model:
        torch.save(model.state_dict(), "digits_mlp.pt")


if __name__ == "__main__":
    main()
