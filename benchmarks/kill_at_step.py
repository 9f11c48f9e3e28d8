"""Run a training script unchanged, SIGKILL one rank at a fixed optimizer step of the first
run, and stamp the first optimizer step of every later run: the recovery benchmark's probe.

    python kill_at_step.py SCRIPT [ARGS...]

Environment: BENCH_MARKS (a directory for the stamps), BENCH_KILL_RANK, BENCH_KILL_STEP.
"First run" is MUSTER_ATTEMPT=1 under muster and TORCHELASTIC_RESTART_COUNT=0 under
torchrun. The stamps are files named `kill` and `first-step-<run>-rank-<r>` holding a
unix time; the hook is a global optimizer step hook, so the script itself is not touched.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook


def _run_number() -> int:
    if "MUSTER_ATTEMPT" in os.environ:
        return int(os.environ["MUSTER_ATTEMPT"])
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1


def _stamp(path: Path) -> None:
    path.write_text(f"{time.time():.6f}\n")


def main() -> None:
    marks = Path(os.environ["BENCH_MARKS"])
    rank, run = int(os.environ.get("RANK", "0")), _run_number()
    kill_rank, kill_step = int(os.environ["BENCH_KILL_RANK"]), int(os.environ["BENCH_KILL_STEP"])
    steps = 0

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal steps
        steps += 1
        if steps == 1 and run > 1:
            _stamp(marks / f"first-step-{run}-rank-{rank}")
        if run == 1 and rank == kill_rank and steps == kill_step:
            _stamp(marks / "kill")
            os.kill(os.getpid(), signal.SIGKILL)

    register_optimizer_step_post_hook(after_step)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
