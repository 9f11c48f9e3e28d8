"""A silent data bias in DDP: every rank draws the same "random" samples.

    muster experiment create bias.yaml .         # the bug: ends SUSPECT, naming it
    muster experiment create bias-fixed.yaml .   # --fixed: passes every diagnostic

The digits are imbalanced on purpose here (classes 0-2 weigh 4x), so the loader draws with
`WeightedRandomSampler(replacement=True)`. A sampler like that cannot be split across ranks
the way DistributedSampler splits a data set; each rank draws its own share. Written the
way it usually is, with one seed for "everything", every rank draws exactly the same
indices: two ranks train on one rank's data twice, and nothing fails — the loss goes down,
the process exits 0. muster's diagnostics (muster.harness.torch) see each rank's draws and
seeds, and muster ends the trial SUSPECT: "ranks 0 and 1 drew 100% the same samples".

`--fixed` gives each rank its own generator, `torch.Generator().manual_seed(seed + rank)`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler
from train import load_images, split

import muster.harness as mh
import muster.harness.torch as mt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixed", action="store_true",
                        help="give each rank its own sampler generator (seed + rank)")
    return parser.parse_args()


def weighted_loader(x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace, rank: int,
                    world_size: int) -> DataLoader:
    weights = torch.where(y < 3, 4.0, 1.0)  # the rare classes drawn 4x as often
    seed = args.seed + rank if args.fixed else args.seed  # the bug: no "+ rank"
    sampler = WeightedRandomSampler(weights, num_samples=len(y) // world_size,
                                    replacement=True,
                                    generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(x, y), batch_size=args.batch_size, sampler=sampler)


def train(ctx: mh.Context, args: argparse.Namespace, data: tuple[torch.Tensor, ...]) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_val, y_val = data
    loader = weighted_loader(x_train, y_train, args, rank, world_size)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(),
                                                  nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    first_epoch, step = 0, 0
    if resumed := mt.restore(ctx, model=model, optimizer=optimizer):  # also samples gradients
        first_epoch, step = (resumed.sampler_epoch or 0) + 1, resumed.step
    mt.diagnose(ctx, loader=loader)  # records what this rank's sampler draws
    for epoch in range(first_epoch, args.epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            ctx.samples.seen(len(y), epoch=epoch)
            ctx.report_training(step, {"loss": loss.item()})  # every rank: its own loss
        # The validation split is read once per epoch, half by each rank.
        model.eval()
        with torch.no_grad():
            shard = slice(rank, None, world_size)
            logits = model(x_val[shard])
            totals = torch.tensor([loss_fn(logits, y_val[shard]).item() * len(logits),
                                   (logits.argmax(1) == y_val[shard]).sum().item(),
                                   len(logits)], dtype=torch.float64)
        dist.all_reduce(totals)
        ctx.samples.seen(len(logits), epoch=epoch)
        if rank == 0:
            ctx.report_validation(step, {"val_loss": totals[0].item() / totals[2].item(),
                                         "val_accuracy": totals[1].item() / totals[2].item()})
            print(f"epoch {epoch}  val_accuracy {totals[1].item() / totals[2].item():.3f}",
                  flush=True)
        mt.save(ctx, step, model=model, optimizer=optimizer, sampler_epoch=epoch)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    data = split(*load_images(args.data, skip_corrupt=False), args.seed)
    with mh.init(hparams=vars(args) | {"data": str(args.data)}) as ctx:
        dist.init_process_group("gloo")
        try:
            train(ctx, args, data)
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
