"""`python3 -m determined.launch.torch_distributed [--] SCRIPT...`: under muster, run SCRIPT.

Determined's launcher starts `torch.distributed.run` in each container, which starts one
process per slot with torchrun's variables. muster starts one process per rank itself
(`resources.replicas`), each with those variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so this launcher replaces itself with SCRIPT
(`os.execvp`): the same process muster supervises, the same environment. SCRIPT is run as
written; `python3` is the trial's own, first on its PATH.

torch.distributed.run's arguments before a `--` would change how many processes start and
where; muster decides that, so they are refused, as is `--trial` (Trial classes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

USAGE = "usage: python3 -m determined.launch.torch_distributed [--] SCRIPT..."


class UsageError(ValueError):
    """The command line cannot be run under muster; the message says why."""


def script_of(argv: Sequence[str]) -> list[str]:
    """The command to run: `argv` less an empty `--` prefix.

    Raises:
        UsageError: torch.distributed.run's arguments before `--`, `--trial`, or no script.
    """
    args = list(argv)
    if "--" in args:
        split = args.index("--")
        overrides, args = args[:split], args[split + 1:]
        if overrides:
            raise UsageError(f"torch.distributed.run's arguments {' '.join(overrides)} have no "
                             "meaning under muster: it starts one process per rank itself "
                             "(resources.replicas); remove them and the `--`")
    if args and (args[0] == "--trial" or args[0].startswith("--trial=")):
        raise UsageError("Trial classes are not supported under muster (`--trial`): run a "
                         "script that uses det.core.init()")
    if not args:
        raise UsageError(f"no script to run\n{USAGE}")
    return args


def main(argv: Sequence[str]) -> NoReturn:
    try:
        script = script_of(argv)
    except UsageError as exc:
        print(f"determined.launch.torch_distributed: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(script[0], script)
    except OSError as exc:
        print(f"determined.launch.torch_distributed: cannot run {script[0]!r}: {exc}",
              file=sys.stderr)
        raise SystemExit(127) from None


if __name__ == "__main__":
    main(sys.argv[1:])
