"""(t) What muster's framework integrations cost a training step: Lightning, the Hugging Face
Trainer and Accelerate, each with and without muster's callback (tracker), side by side.

The step is 10 ms of work by design (the issue's target: at most 1% at a 10 ms step): a
tiny model whose forward spins for 10 ms of its thread's CPU time, so the framework's own
per-step cost and muster's are what differ between the arms, and muster's background thread
competes for the interpreter as it would next to real work (a spin holds the GIL; a sleep
would not). Each arm is a whole `fit`/`train`/loop of STEPS steps; its cost per step is
taken between the steps' starts after WARMUP steps, so start-up and teardown are left out,
on two clocks: the process's CPU time (all its threads: muster's writer thread counts),
which other tenants of a shared machine barely move, and wall-clock.

The worst case for the integration: every step is logged (`log_every_n_steps=1`,
`logging_steps=1`, `accelerator.log` each step), so muster writes a report per step; the
bare arms log the same through the framework's own default (Lightning's CSV logger, the
Trainer's log history, Accelerate with no tracker).

One process per framework (its import once), the arms alternating, REPETITIONS pairs; the
overhead is the median over the pairs of (muster / bare) - 1. Every muster arm checks what
it wrote (its metrics file has a report for the last step).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measure import expect
from report import Outcome, Table, Target

NAME = "integrations_overhead"
STEP_S = 0.010
TARGET_OVERHEAD = 0.01
FRAMEWORKS = ("lightning", "transformers", "accelerate")


def run(quick: bool) -> Outcome:
    steps, repetitions = (60, 2) if quick else (200, 7)
    rows, targets, data = [], [], {}
    for framework in FRAMEWORKS:
        with tempfile.TemporaryDirectory(prefix="muster-bench-integrations-") as folder:
            result = _worker_run(framework, Path(folder), steps, repetitions)
        data[framework] = result
        for clock, index in (("CPU", 0), ("wall", 1)):
            bare = [b[index] for b in result["bare"]]
            muster = [m[index] for m in result["muster"]]
            pairs = sorted(m / b - 1 for m, b in zip(muster, bare, strict=True))
            overhead = statistics.median(pairs)
            rows.append([framework, clock, f"{statistics.median(bare) * 1e3:.3f}",
                         f"{statistics.median(muster) * 1e3:.3f}", f"{overhead * 100:+.2f}%",
                         f"{pairs[0] * 100:+.2f}% … {pairs[-1] * 100:+.2f}%"])
            if clock == "CPU":
                targets.append(Target(f"{framework}: muster's integration per 10 ms step "
                                      "(process CPU time)", f"{overhead:+.2%}",
                                      overhead <= TARGET_OVERHEAD))
    table = Table(f"A 10 ms training step, logged every step ({repetitions} pairs of "
                  f"{steps}-step runs per framework, one process each)",
                  ["framework", "clock", "bare ms/step", "with muster ms/step",
                   "overhead (median of pairs)", "pairs' range"], rows)
    return Outcome(NAME, [table], targets, data=data)


def _worker_run(framework: str, folder: Path, steps: int, repetitions: int) -> dict[str, Any]:
    out = folder / "result.json"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    environ.update(MUSTER_RUN_DIR=str(folder / "run"), OMP_NUM_THREADS="1",
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, __file__, "--worker", framework, str(steps),
                           str(repetitions), str(out)], env=environ, cwd=folder,
                          capture_output=True, text=True, timeout=1200)
    expect(done.returncode == 0, f"the {framework} worker failed: {done.stderr[-3000:]}")
    # Read once the worker ended: a Trainer's session is closed at the process's exit.
    metrics = folder / "run" / "attempt-1" / "rank-0.metrics.jsonl"
    steps_reported = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    expect(max(steps_reported) >= steps, f"{framework}: muster's last report is at step "
                                         f"{max(steps_reported)}, not {steps}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


# -- inside a worker process -------------------------------------------------------------

WARMUP = 10


def _spin(seconds: float) -> None:
    """`seconds` of this thread's CPU time, however busy the machine is."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def _mark() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _per_step(starts: list[tuple[float, float]]) -> tuple[float, float]:
    """(CPU, wall) seconds per step between the starts after the warm-up."""
    first, last, count = starts[WARMUP], starts[-1], len(starts) - WARMUP - 1
    return (last[0] - first[0]) / count, (last[1] - first[1]) / count


def _lightning(steps: int, folder: Path) -> Callable[[bool], tuple[float, float]]:
    import lightning as L
    import torch

    from muster.integrations.lightning import MusterCallback

    class Spinning(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            _spin(STEP_S)
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Starts(L.Callback):
        def __init__(self) -> None:
            self.starts: list[tuple[float, float]] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.starts.append(_mark())

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)),
                                       batch_size=8)

    def arm(with_muster: bool) -> tuple[float, float]:
        starts = Starts()
        callbacks: list[Any] = [starts, *([MusterCallback()] if with_muster else [])]
        trainer = L.Trainer(max_steps=steps, accelerator="cpu", log_every_n_steps=1,
                            enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, callbacks=callbacks,
                            default_root_dir=str(folder))
        trainer.fit(Spinning(), data)
        return _per_step(starts.starts)

    return arm


def _transformers(steps: int, folder: Path) -> Callable[[bool], tuple[float, float]]:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from muster.integrations.transformers import MusterCallback

    class Spinning(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            _spin(STEP_S)
            return {"loss": self.layer(x).pow(2).mean()}

    class Starts(TrainerCallback):
        def __init__(self) -> None:
            self.starts: list[tuple[float, float]] = []

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.starts.append(_mark())

    rows = [{"x": torch.randn(8)} for _ in range(64)]

    def arm(with_muster: bool) -> tuple[float, float]:
        starts = Starts()
        args = TrainingArguments(output_dir=str(folder / "out"), max_steps=steps,
                                 per_device_train_batch_size=8, logging_steps=1,
                                 save_strategy="no", report_to="none", use_cpu=True,
                                 disable_tqdm=True)
        callbacks: list[Any] = [starts, *([MusterCallback()] if with_muster else [])]
        Trainer(model=Spinning(), args=args, train_dataset=rows, callbacks=callbacks).train()
        return _per_step(starts.starts)

    return arm


def _accelerate(steps: int, folder: Path) -> Callable[[bool], tuple[float, float]]:
    import torch
    from accelerate import Accelerator

    from muster.integrations.accelerate import MusterTracker

    def arm(with_muster: bool) -> tuple[float, float]:
        trackers = [MusterTracker(steps=steps)] if with_muster else []
        accelerator = Accelerator(cpu=True, log_with=trackers or None)
        accelerator.init_trackers("bench")
        model = torch.nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        x, starts = torch.randn(8, 8), []
        for step in range(1, steps + 1):
            starts.append(_mark())
            _spin(STEP_S)
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss.item()}, step=step)
        accelerator.end_training()
        return _per_step(starts)

    return arm


def _worker(framework: str, steps: int, repetitions: int, out: Path) -> None:
    folder = out.parent
    arm = {"lightning": _lightning, "transformers": _transformers,
           "accelerate": _accelerate}[framework](steps, folder)
    arm(False)  # one unmeasured run of each: imports, first-use caches
    arm(True)
    times: dict[str, list[tuple[float, float]]] = {"bare": [], "muster": []}
    for repetition in range(repetitions):
        order = (False, True) if repetition % 2 == 0 else (True, False)
        for with_muster in order:
            times["muster" if with_muster else "bare"].append(arm(with_muster))
    out.write_text(json.dumps(times))


def main() -> int:
    """Run alone (`.venv/bin/python benchmarks/integrations_overhead.py [--quick]`), reported
    and saved as `run.py --only integrations_overhead` does."""
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
        return 0
    import run as benchmarks

    return benchmarks.main(["--only", NAME, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
