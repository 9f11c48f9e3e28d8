"""The recovery benchmark's Ray Train arm: examples/digits/ddp.py's training, as a
`TorchTrainer` with `FailureConfig(max_failures=3)`.

    python ray_train_digits.py --data DATA --epochs N --storage DIR

The same model (`ddp.make_model`), data (`train.load_images`, `train.split`), sampler,
optimizer, scheduler and per-epoch checkpoint (rank 0's, through `ray.train.report`) as the
example; a restarted worker group resumes from `ray.train.get_checkpoint()`. The kill probe
is kill_at_step.py's (BENCH_MARKS, BENCH_KILL_RANK, BENCH_KILL_STEP): rank 1 SIGKILLs itself
at its step BENCH_KILL_STEP of the first run (no `kill` stamp yet), and each rank of a later
run stamps its first optimizer step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def train_loop(config: dict[str, Any]) -> None:
    sys.path.insert(0, config["code"])
    import ray.train
    import torch
    import torch.distributed as dist
    from ddp import evaluate, make_model
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from train import load_images, split

    torch.set_num_threads(1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    marks = Path(os.environ["BENCH_MARKS"])
    later = (marks / "kill").exists()
    steps = 0

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal steps
        steps += 1
        if steps == 1 and later:
            (marks / f"first-step-2-rank-{rank}").write_text(f"{time.time():.6f}\n")
        if not later and rank == int(os.environ["BENCH_KILL_RANK"]) \
                and steps == int(os.environ["BENCH_KILL_STEP"]):
            (marks / "kill").write_text(f"{time.time():.6f}\n")
            os.kill(os.getpid(), signal.SIGKILL)

    register_optimizer_step_post_hook(after_step)
    x_train, y_train, x_val, y_val = split(*load_images(Path(config["data"]),
                                                        skip_corrupt=False), 0)
    val_shard = list(DistributedSampler(TensorDataset(x_val), world_size, rank, shuffle=False))
    x_val, y_val = x_val[val_shard], y_val[val_shard]
    sampler = DistributedSampler(TensorDataset(x_train, y_train), world_size, rank,
                                 shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=32, sampler=sampler)
    torch.manual_seed(rank)
    model = DistributedDataParallel(make_model(64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()
    first_epoch = 1
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as where:
            state = torch.load(Path(where) / "state.pt", weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        first_epoch = state["epoch"] + 1
    for epoch in range(first_epoch, config["epochs"] + 1):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        scheduler.step()
        val_loss, accuracy = evaluate(model, x_val, y_val, loss_fn)
        with tempfile.TemporaryDirectory() as tmp:
            saved = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "epoch": epoch},
                           Path(tmp) / "state.pt")
                saved = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"epoch": epoch, "val_loss": val_loss, "accuracy": accuracy},
                             checkpoint=saved)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--storage", required=True)
    args = parser.parse_args()
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import ray

    env = {name: os.environ[name] for name in ("BENCH_MARKS", "BENCH_KILL_RANK",
                                               "BENCH_KILL_STEP", "OMP_NUM_THREADS")}
    ray.init(log_to_driver=False, runtime_env={"env_vars": env})  # for every worker
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"code": str(HERE), "data": args.data, "epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=f"digits-{os.getpid()}-{int(time.time())}",
                             storage_path=args.storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             failure_config=FailureConfig(max_failures=3)),
    )
    result = trainer.fit()
    print(f"Ray Train ended: {result.metrics}", flush=True)
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
