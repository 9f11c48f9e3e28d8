#!/usr/bin/env python3
"""Run a training script as `__main__`, slowed down in its first attempt, for fault tests.

    paced.py SCRIPT [ARGS...]

With MUSTER_TEST_PACE=S set, every `ctx.samples.seen` call of attempt 1 (MUSTER_ATTEMPT)
sleeps S seconds after counting, so a test can watch the run reach the middle of an epoch
and kill a rank there; later attempts run at full speed. The script itself is unchanged:
its directory goes first on sys.path, as when Python runs it directly.
"""

import os
import runpy
import sys
import time
from pathlib import Path

from muster.harness.samples import Samples


def pace(seconds: float) -> None:
    count = Samples.seen

    def paced(self: Samples, n: int, *, epoch: int) -> None:
        count(self, n, epoch=epoch)
        time.sleep(seconds)

    Samples.seen = paced  # type: ignore[method-assign]


def main() -> None:
    script = Path(sys.argv[1]).resolve()
    seconds = float(os.environ.get("MUSTER_TEST_PACE", "0"))
    if seconds > 0 and os.environ.get("MUSTER_ATTEMPT") == "1":
        pace(seconds)
    sys.argv = sys.argv[1:]
    sys.path[0] = str(script.parent)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
