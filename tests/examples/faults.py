#!/usr/bin/env python3
"""Run a training script as `__main__` with the faults a test asks for; the script unchanged.

    python lightning_faults.py SCRIPT [ARGS...]

- TEST_PACE=S: every optimizer step sleeps S seconds in the attempts that
  TEST_PACE_ATTEMPTS lists ("1,2"; default "1"), so a test can act mid-run;
- TEST_CRASH_AT=N: optimizer step N raises, and this wrapper catches the error and
  exits 0, as a script that swallows its crash does.

Steps are counted by a global optimizer hook (torch.optim), so any framework is paced.
"""

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook


class InjectedCrash(RuntimeError):
    pass


def hook_steps() -> None:
    attempts = os.environ.get("TEST_PACE_ATTEMPTS", "1").split(",")
    pace = float(os.environ.get("TEST_PACE", "0"))
    pace = pace if os.environ.get("MUSTER_ATTEMPT", "1") in attempts else 0.0
    crash_at = int(os.environ.get("TEST_CRASH_AT", "0"))
    done = [0]

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        done[0] += 1
        if done[0] == crash_at:
            raise InjectedCrash(f"injected crash at optimizer step {crash_at}")
        if pace:
            time.sleep(pace)

    register_optimizer_step_post_hook(after_step)


def main() -> None:
    script = Path(sys.argv[1]).resolve()
    hook_steps()
    sys.argv = sys.argv[1:]
    sys.path[0] = str(script.parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except InjectedCrash as exc:
        print(f"caught: {exc}; carrying on as if nothing happened", flush=True)


if __name__ == "__main__":
    main()
