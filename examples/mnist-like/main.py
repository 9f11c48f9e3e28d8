"""An image classifier in the style of pytorch/examples' mnist/main.py, on the digits data
set that scikit-learn bundles (no download): the 8x8 digits are written once as PNG files in
class folders, read back with torchvision's ImageFolder and transforms, and learned by the
same small convolutional net. Runs as is (`python main.py`) and under muster
(examples/mnist-like/experiment.yaml), where torchvision comes from the experiment's own
environment (`environment.pip`), built once and cached.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torchvision import datasets, transforms

import muster.harness as mh


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def write_pngs(root: Path) -> Path:
    """The digits as `root/<split>/<label>/<n>.png` (once), 80% train, 20% test."""
    if (root / "test").is_dir():
        return root
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for n, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        split = "test" if n % 5 == 0 else "train"
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (image * (255 / 16)).astype("uint8")
        Image.fromarray(pixels, mode="L").save(folder / f"{n}.png")
    return root


def train(args: argparse.Namespace, model: Net, loader: torch.utils.data.DataLoader,
          optimizer: optim.Optimizer, epoch: int, ctx: mh.Context) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        ctx.samples.seen(len(data), epoch=epoch)
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]"
                  f"\tLoss: {loss.item():.6f}")
    ctx.report_training(epoch, {"loss": loss.item()})


def test(model: Net, loader: torch.utils.data.DataLoader, epoch: int, ctx: mh.Context) -> None:
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    test_loss /= len(loader.dataset)
    accuracy = correct / len(loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/"
          f"{len(loader.dataset)} ({100. * accuracy:.0f}%)\n")
    ctx.report_validation(epoch, {"val_loss": test_loss, "val_accuracy": accuracy})


def main() -> None:
    parser = argparse.ArgumentParser(description="digits as PNG files, mnist-style")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--data", default="data/digits-png")
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    # mnist's transforms, and a resize: the digits are 8x8, the net wants 28x28.
    transform = transforms.Compose([
        transforms.Grayscale(), transforms.Resize((28, 28)), transforms.ToTensor(),
        transforms.Normalize((0.1307,), (0.3081,))])
    root = write_pngs(Path(args.data))
    train_set = datasets.ImageFolder(str(root / "train"), transform=transform)
    test_set = datasets.ImageFolder(str(root / "test"), transform=transform)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size,
                                               shuffle=True)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=1000)

    with mh.init() as ctx:
        ctx.plan(epochs=args.epochs)  # "verified" needs the run to reach it
        model = Net()
        optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
        scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
        start = 1
        restored = ctx.checkpoint.restore()
        if restored is not None:
            state = torch.load(restored.path / "state.pt")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["epoch"] + 1
        for epoch in range(start, args.epochs + 1):
            train(args, model, train_loader, optimizer, epoch, ctx)
            test(model, test_loader, epoch, ctx)
            scheduler.step()
            with ctx.checkpoint.save(epoch) as path:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, path / "state.pt")
            if ctx.should_stop():
                break


if __name__ == "__main__":
    main()
