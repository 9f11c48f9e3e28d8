"""(x) The coded-bias diagnostics' cost on a DDP step (issue 17: at most 2% of a step).

Two ranks on gloo (two processes on this machine, one thread each) train the digits MLP of
examples/digits/ddp.py (64-64-10, batch 32 per rank, a DistributedSampler over scikit-learn's
digits) with two identical DDP models side by side in the same process group: one plain,
one watched by `muster.harness.torch.diagnose` with the default interval (a gradient-norm
and parameter-hash sample every 20 optimizer steps, the sampler's draws recorded). Blocks
of steps alternate between the two (the order swaps each block), so both see the same
machine; the step time is rank 0's, between barriers. Reported: the median per-step time
of each arm over the blocks, and the overhead: per run (a new pair of processes), the median
over the blocks of the watched block's time over the plain block's beside it; then the
median of 5 runs (one with `--quick`). An A/A run (both arms plain) measured -1.6..-0.6%
here: runs differ by a few percent with where the two ranks land on the two cores.
Beside it, what a rank's reproducibility snapshot costs at `init()` (issue 17: under
100 ms): `snapshot.capture()` timed in the same rank, torch, numpy and scikit-learn
imported, 20 times per run.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from report import Outcome, Table, Target

NAME = "diagnostics_overhead"
TARGET_OVERHEAD = 0.02
TARGET_CAPTURE_S = 0.100
RUNS = 5  # process pairs: a pair's blocks share its placement on the cores
CAPTURES = 20
INTERVAL = 20  # the default of diagnostics.interval


def run(quick: bool) -> Outcome:
    runs, blocks, steps = (1, 6, 100) if quick else (RUNS, 20, 200)
    results = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="muster-bench-diag-") as folder:
            results.append(_two_ranks(Path(folder), blocks, steps))
    # Paired: each block of one arm against the other's block next to it, so a slow stretch
    # of the machine weighs on both; then the median of the runs (their spread is shown).
    overheads = sorted(statistics.median(w / p for w, p in zip(r["watched"], r["plain"],
                                                                strict=True)) - 1
                       for r in results)
    overhead = statistics.median(overheads)
    plain = [t for r in results for t in r["plain"]]
    watched = [t for r in results for t in r["watched"]]
    result = results[0] | {"capture_s": [t for r in results for t in r["capture_s"]]}
    table = Table(
        f"Diagnostics on a 2-rank DDP step (gloo; {runs} runs of {blocks} blocks of {steps} "
        f"steps per arm, interval {INTERVAL})",
        ["arm", "median ms/step", "min", "max"],
        [[arm, f"{statistics.median(times) * 1e3:.3f}", f"{min(times) * 1e3:.3f}",
          f"{max(times) * 1e3:.3f}"] for arm, times in (("plain DDP", plain),
                                                      ("with diagnostics", watched))]
        + [["overhead (median of the runs)", f"{overhead * 100:+.2f}%",
            f"{overheads[0] * 100:+.2f}%", f"{overheads[-1] * 100:+.2f}%"]],
    )
    capture = statistics.median(result["capture_s"])
    snapshot_table = Table(
        f"A rank's snapshot capture (torch, numpy, scikit-learn imported; {CAPTURES} runs)",
        ["median ms", "min", "max"],
        [[f"{capture * 1e3:.1f}", f"{min(result['capture_s']) * 1e3:.1f}",
          f"{max(result['capture_s']) * 1e3:.1f}"]])
    return Outcome(
        NAME, [table, snapshot_table],
        [Target("diagnostics overhead on a DDP step of the digits example", f"{overhead:+.2%}",
                overhead <= TARGET_OVERHEAD),
         Target("a rank's snapshot capture at init()", f"{capture * 1e3:.1f} ms",
                capture < TARGET_CAPTURE_S)],
        notes=[f"records written by the watched arm: {result['records']}"],
        data={"plain_s": plain, "watched_s": watched, "overhead": overhead,
              "overheads": overheads},
    )


def _two_ranks(folder: Path, blocks: int, steps: int) -> dict[str, Any]:
    port = _free_port()
    out = folder / "result.json"
    environ = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "MUSTER_DIAGNOSTICS": str(INTERVAL),
               "OMP_NUM_THREADS": "1"}
    environ.pop("MUSTER_RUN_DIR", None)
    ranks = [subprocess.Popen([sys.executable, __file__, "--worker", str(blocks), str(steps),
                               str(out)], env={**environ, "RANK": str(rank)}, cwd=folder)
             for rank in (0, 1)]
    codes = [rank.wait(timeout=900) for rank in ranks]
    if any(codes):
        raise RuntimeError(f"the benchmark's ranks exited {codes}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _worker(blocks: int, steps: int, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import muster.harness as mh
    import muster.harness.torch as mt
    from muster.harness import snapshot

    torch.set_num_threads(1)
    digits = load_digits()
    data = TensorDataset(torch.tensor(digits.data, dtype=torch.float32) / 16,
                         torch.tensor(digits.target))
    with mh.init() as ctx:
        dist.init_process_group("gloo")
        rank = dist.get_rank()

        def arm(watched: bool) -> Any:
            torch.manual_seed(0)
            model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(),
                                                          nn.Linear(64, 10)))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            sampler = DistributedSampler(data, 2, rank, shuffle=True, seed=0)
            loader = DataLoader(data, batch_size=32, sampler=sampler)
            if watched:
                mt.diagnose(ctx, model=model, optimizer=optimizer, loader=loader)
            return model, optimizer, sampler, loader, _batches(loader, sampler)

        arms = {"plain": arm(False), "watched": arm(True)}
        loss_fn = nn.CrossEntropyLoss()
        times: dict[str, list[float]] = {"plain": [], "watched": []}
        for block in range(blocks + 1):  # the first block of each arm warms up
            order = ["plain", "watched"] if block % 2 == 0 else ["watched", "plain"]
            for name in order:
                model, optimizer, _, _, batches = arms[name]
                dist.barrier()
                began = time.perf_counter()
                for _ in range(steps):
                    x, y = next(batches)
                    optimizer.zero_grad()
                    loss_fn(model(x), y).backward()
                    optimizer.step()
                dist.barrier()
                if block > 0:
                    times[name].append((time.perf_counter() - began) / steps)
        dist.destroy_process_group()
    if rank == 0:
        diagnostics = ctx.run_dir / "attempt-1" / "rank-0.diagnostics.jsonl"
        records = len(diagnostics.read_text().splitlines()) if diagnostics.exists() else 0
        captures = []
        for _ in range(CAPTURES):
            began = time.perf_counter()
            snapshot.capture()
            captures.append(time.perf_counter() - began)
        out.write_text(json.dumps({**times, "records": records, "capture_s": captures}))


def _batches(loader: Any, sampler: Any) -> Any:
    """Batches without end, a new epoch (and a pass the diagnostics record) each time."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def main() -> int:
    """Run alone (`.venv/bin/python benchmarks/diagnostics_overhead.py [--quick]`), reported
    and saved as `run.py --only diagnostics_overhead` does."""
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return 0
    import run as benchmarks

    return benchmarks.main(["--only", NAME, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
