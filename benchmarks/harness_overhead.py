"""(h) What `muster.harness` costs a training loop that reports on every step.

Loop: a tiny PyTorch model on one CPU thread (64 → 32 → 10 MLP, batch of 32,
cross-entropy, SGD): zero_grad, forward, backward, step. That is about as short as a real
training step gets, so it is the hardest case for a per-step cost. Arms:

- bare: the loop alone; it runs twice per repetition ("bare" and "bare, again"), and the
  second shows how far two runs of the same code differ here: the noise floor;
- report: the same loop inside `with init()`, calling `ctx.report_training(step,
  {"loss": loss})` on every step (the 0-d loss tensor itself, which the harness turns into
  a number);
- report + samples: also `ctx.samples.seen(32, epoch=0)` on every step.

Each arm runs 100,000 steps in all, as interleaved runs of 10,000 steps (the order rotates
each repetition), so a slow phase of this shared machine hits every arm alike. Each harness
run is a whole `init()` session: check-in, the background thread's flushes and heartbeats,
and the final flush at exit are all in its time. Its run directory is on /dev/shm (when
there is one), so the numbers are the harness's CPU cost, not the disk's latency. Each
harness run must leave exactly one metrics line per step, in order, and its samples.

Also the cost of one call, in a loop that does nothing else, against the empty loop.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from measure import expect, interleave, median
from report import Outcome, Table, Target

import muster.harness as mh

TARGET_OVERHEAD = 0.02
BATCH = 32
TOTAL_STEPS = 100_000
SHM = Path("/dev/shm")


def run(quick: bool) -> Outcome:
    # torch is imported here, not at the top: run.py imports every benchmark module, and
    # the others should not pay torch's import.
    import torch

    steps, runs = (2_000, 5) if quick else (10_000, TOTAL_STEPS // 10_000)
    calls, call_runs = (50_000, 3) if quick else (300_000, 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _platform_environment() as new_run_dir:
            loop = _TrainingLoop(torch)
            loop.bare(1_000)  # warm-up: allocator, autograd, caches
            loop.with_harness(1_000, new_run_dir(), samples=True)
            times = interleave({
                "bare": lambda: loop.bare(steps),
                "bare, again": lambda: loop.bare(steps),
                "report": lambda: loop.with_harness(steps, new_run_dir(), samples=False),
                "report + samples": lambda: loop.with_harness(steps, new_run_dir(),
                                                              samples=True),
            }, runs)
            per_call = _per_call_costs(torch, calls, call_runs, new_run_dir)
    finally:
        torch.set_num_threads(threads)
    return _outcome(steps, times, calls, per_call)


class _TrainingLoop:
    def __init__(self, torch: Any) -> None:
        torch.manual_seed(0)
        nn = torch.nn
        self.model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loss_fn = nn.CrossEntropyLoss()
        self.inputs = torch.randn(BATCH, 64)
        self.targets = torch.randint(0, 10, (BATCH,))

    def step(self) -> Any:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def bare(self, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        return time.perf_counter() - start

    def with_harness(self, steps: int, run_dir: Path, samples: bool) -> float:
        start = time.perf_counter()
        with mh.init() as ctx:
            if samples:
                for step in range(steps):
                    loss = self.step()
                    ctx.samples.seen(BATCH, epoch=0)
                    ctx.report_training(step, {"loss": loss})
            else:
                for step in range(steps):
                    loss = self.step()
                    ctx.report_training(step, {"loss": loss})
        elapsed = time.perf_counter() - start
        _check_run(run_dir, steps, samples)
        return elapsed


def _check_run(run_dir: Path, steps: int, samples: bool) -> None:
    attempt = run_dir / "attempt-1"
    lines = (attempt / "rank-0.metrics.jsonl").read_bytes().splitlines()
    expect(len(lines) == steps, f"{len(lines)} metrics lines for {steps} steps in {run_dir}")
    expect([json.loads(line)["step"] for line in lines] == list(range(steps)),
           f"the metrics lines in {run_dir} are not steps 0..{steps - 1} in order")
    if samples:
        epochs = json.loads((attempt / "rank-0.samples.json").read_bytes())["epochs"]
        expect(epochs == {"0": steps * BATCH}, f"samples.json says {epochs}")


def _per_call_costs(
    torch: Any, calls: int, runs: int, new_run_dir: Callable[[], Path]
) -> dict[str, list[float]]:
    """Seconds per call of each harness call, less the empty loop's cost per iteration."""
    tensor = torch.tensor(0.5)
    new_run_dir()
    with mh.init() as ctx:
        arms: dict[str, Callable[[], float]] = {
            "empty loop": lambda: _timed_calls(calls, lambda step: None),
            "report_training(step, {'loss': float})":
                lambda: _timed_calls(calls, lambda step: ctx.report_training(
                    step, {"loss": 0.5})),
            "report_training(step, {'loss': 0-d tensor})":
                lambda: _timed_calls(calls, lambda step: ctx.report_training(
                    step, {"loss": tensor})),
            "samples.seen(32, epoch=0)":
                lambda: _timed_calls(calls, lambda step: ctx.samples.seen(BATCH, epoch=0)),
        }
        timings = interleave(arms, runs)
    empty = median(timings.pop("empty loop"))
    return {name: [(t - empty) / calls for t in values] for name, values in timings.items()}


def _timed_calls(calls: int, call: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for step in range(calls):
        call(step)
    return time.perf_counter() - start


@contextmanager
def _platform_environment() -> Iterator[Callable[[], Path]]:
    """Point the harness at a fresh run directory each time the yielded function is called."""
    names = ("MUSTER_RUN_DIR", "MUSTER_TRIAL_ID", "MUSTER_ATTEMPT", "MUSTER_HPARAMS",
             "MUSTER_LATEST_CHECKPOINT", "MUSTER_HEARTBEAT_TIMEOUT", "RANK", "WORLD_SIZE")
    saved = {name: os.environ.get(name) for name in names}
    parent = SHM if SHM.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="muster-bench-harness-", dir=parent) as tmp:
        hparams = Path(tmp) / "hparams.json"
        hparams.write_text("{}")
        count = iter(range(1_000_000))

        def new_run_dir() -> Path:
            run_dir = Path(tmp) / f"run-{next(count)}"
            os.environ.update({"MUSTER_RUN_DIR": str(run_dir), "MUSTER_TRIAL_ID": "1",
                               "MUSTER_ATTEMPT": "1", "MUSTER_HPARAMS": str(hparams)})
            return run_dir

        try:
            yield new_run_dir
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _outcome(
    steps: int, times: dict[str, list[float]], calls: int, per_call: dict[str, list[float]]
) -> Outcome:
    bare = times["bare"]
    overheads = {name: _overhead(bare, values) for name, values in times.items() if name != "bare"}
    total = len(bare) * steps
    loop = Table(
        f"(h) a training loop, with and without the harness: {total:,} steps per arm, "
        f"in {len(bare)} interleaved runs of {steps:,}",
        ["arm", "median s per run", "µs per step", "min s", "max s",
         "overhead: ratio of medians", "median of paired ratios", "ratio of minimums"],
        [_loop_row(name, values, steps, overheads.get(name)) for name, values in times.items()],
    )
    costs = Table(
        f"(h) cost of one call ({calls:,} calls in a loop, less the empty loop)",
        ["call", "median ns", "min ns", "max ns"],
        [[name, f"{median(v) * 1e9:.0f}", f"{min(v) * 1e9:.0f}", f"{max(v) * 1e9:.0f}"]
         for name, v in per_call.items()],
    )
    report_overhead = overheads["report"][0]
    target = Target(f"(h) `report_training` on every step adds ≤ {TARGET_OVERHEAD:.0%} to a "
                    "training loop (ratio of medians)", f"{report_overhead:+.2%}",
                    report_overhead <= TARGET_OVERHEAD)
    added_us = (median(times["report"]) - median(bare)) / steps * 1e6
    notes = [f"`report_training` added {added_us:.1f} µs per step here: ≤ "
             f"{TARGET_OVERHEAD:.0%} for steps of {added_us / TARGET_OVERHEAD:,.0f} µs or "
             "more.",
             "Paired ratio: an arm's run over the bare run of the same repetition, which "
             "ran next to it, so a slow phase of the machine cancels out. Ratio of minimums: "
             "each arm's fastest run, the least disturbed by other work on the machine.",
             "\"bare, again\" runs the bare loop once more: its overhead is the noise floor."]
    data = {"steps_per_run": steps, "runs_s": times, "overheads": overheads,
            "report_added_us_per_step": added_us, "calls": calls, "per_call_s": per_call}
    return Outcome("harness_overhead", [loop, costs], [target], notes, data)


def _overhead(bare: list[float], harness: list[float]) -> tuple[float, float, float]:
    """Ratios of the medians, of each repetition's pair (their median), of the minimums."""
    paired = [h / b for b, h in zip(bare, harness, strict=True)]
    return (median(harness) / median(bare) - 1, median(paired) - 1,
            min(harness) / min(bare) - 1)


def _loop_row(
    name: str, values: list[float], steps: int, overhead: tuple[float, float, float] | None
) -> list[str]:
    ratios = ["", "", ""] if overhead is None else [f"{r:+.2%}" for r in overhead]
    if overhead is not None and name != "bare, again":
        ratios[0] = f"**{ratios[0]}**"
    return [name, f"{median(values):.3f}", f"{median(values) / steps * 1e6:.1f}",
            f"{min(values):.3f}", f"{max(values):.3f}", *ratios]
