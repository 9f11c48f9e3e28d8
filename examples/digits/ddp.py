"""Train the digits MLP with DistributedDataParallel on CPU ranks (gloo), resuming exactly.

    muster experiment create ddp.yaml .                   # 2 replicas under muster (from here)
    torchrun --nproc-per-node 2 ddp.py --data data         # by hand: writes ./muster-run/

Each rank trains on its shard of the PNGs (prepare_data.py) through a DistributedSampler and
counts the samples it was fed; rank 0 reports the loss and the validation metrics (averaged
over every rank's shard of the validation set). At the end of each epoch all ranks save one
checkpoint together with `muster.harness.torch.save` (rank 0 writes it, with every rank's
RNG state), and at start `muster.harness.torch.restore` resumes from the latest one, so a
run killed in epoch 3 redoes epoch 3 from the exact state it began with. When muster asks
any rank to stop, all of them leave together after the epoch's checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch._dynamo  # DDP imports it on first use (~1 s); here, a warm standby pays it ahead
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from train import load_images, split

import muster.harness as mh
import muster.harness.torch as mt


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def make_model(hidden: int) -> nn.Module:
    # Dropout draws from each rank's torch RNG: resuming exactly needs every rank's state.
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(hidden, 10))


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module
) -> tuple[float, float]:
    """Loss and accuracy over every rank's shard of the validation set (an all-reduce)."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        totals = torch.tensor([loss_fn(logits, y).item() * len(y),
                               (logits.argmax(1) == y).sum().item(), len(y)],
                              dtype=torch.float64)
    dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    return loss_sum / count, correct / count


def train(ctx: mh.Context, args: argparse.Namespace, data: tuple[torch.Tensor, ...]) -> int:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_val, y_val = data
    val_shard = list(DistributedSampler(TensorDataset(x_val), world_size, rank, shuffle=False))
    x_val, y_val = x_val[val_shard], y_val[val_shard]
    sampler = DistributedSampler(TensorDataset(x_train, y_train), world_size, rank,
                                 shuffle=True, seed=args.seed)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size,
                        sampler=sampler)
    torch.manual_seed(args.seed + rank)  # DDP copies rank 0's weights to the others
    model = DistributedDataParallel(make_model(args.hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()
    ctx.plan(epochs=args.epochs)  # "verified" needs the run to reach it
    first_epoch, step = 1, 0
    if resumed := mt.restore(ctx, model=model, optimizer=optimizer, scheduler=scheduler):
        first_epoch, step = (resumed.sampler_epoch or 0) + 1, resumed.step
        print(f"rank {rank}: resumed from {resumed.path.name} "
              f"(epoch {resumed.sampler_epoch}, step {step})", flush=True)
    if rank == 0:
        print(f"{world_size} ranks training on {len(x_train)} samples, validating on "
              f"{len(x_val) * world_size}", flush=True)
    for epoch in range(first_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            ctx.samples.seen(len(y), epoch=epoch)  # this rank's shard; muster sums the ranks
            if rank == 0:
                ctx.report_training(step, {"loss": loss.item()})  # rank 0's batch
        scheduler.step()
        val_loss, accuracy = evaluate(model, x_val, y_val, loss_fn)
        ctx.samples.seen(len(y_val), epoch=epoch)  # every file is read once per epoch
        if rank == 0:
            ctx.report_validation(step, {"val_loss": val_loss, "val_accuracy": accuracy})
            print(f"epoch {epoch:3d}  val_loss {val_loss:.4f}  val_accuracy {accuracy:.3f}",
                  flush=True)
        mt.save(ctx, step, model=model, optimizer=optimizer, scheduler=scheduler,
                sampler_epoch=epoch, metadata={"epoch": epoch})
        # An epoch takes well under a second, so the ranks agree to stop at epoch ends.
        if mt.should_stop(ctx):
            print(f"rank {rank}: stop requested; saved epoch {epoch} and leaving", flush=True)
            return 0
    return 0


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    # Before init(): a warm standby (failure_policy.warm_standby) has this done ahead of a
    # failure, and waits in init() until it becomes the retry.
    data = split(*load_images(args.data, skip_corrupt=False), args.seed)
    with mh.init(hparams=vars(args) | {"data": str(args.data)}) as ctx:
        dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_*: muster or torchrun
        try:
            return train(ctx, args, data)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
