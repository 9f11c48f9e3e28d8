"""What every Python process of a trial runs first: the line its layer's `.pth` adds.

`muster.environments.layers.write_pth` puts the harness on a trial's path and, after it,
`import muster.startup`, which reads the job's variables (named in `muster.jobenv`):

- `MUSTER_COMPAT=determined` (`compat: determined`): muster's Determined Core API package
  (`muster/compat/determined`) imports as `determined`, ahead of any installed one;
- `MUSTER_INTEGRATIONS=auto` (`integrations`, on by default for scripts without
  `harness: true`): the import hook that gives Lightning and the Hugging Face Trainer
  muster's callback (`muster.integrations.autohook`).

Anything else (pip, a process started outside muster) finds neither variable and pays two
environment reads. It must never stop an interpreter from starting: a failure is one line
on stderr.
"""

from __future__ import annotations

import os
import sys

COMPAT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compat")
# `muster.jobenv`'s names of these variables (tests/test_startup.py holds them equal):
# importing jobenv here would cost every Python process of a trial ~20 ms (dataclasses,
# pathlib), pip's and each DataLoader worker's included.
COMPAT, INTEGRATIONS, RUN_DIR = "MUSTER_COMPAT", "MUSTER_INTEGRATIONS", "MUSTER_RUN_DIR"


def start(environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
    """Apply the job's `compat` and `integrations` to this interpreter."""
    if environ.get(COMPAT) == "determined" and COMPAT_DIR not in sys.path:
        sys.path.insert(0, COMPAT_DIR)
    if environ.get(INTEGRATIONS) == "auto" and environ.get(RUN_DIR):
        from muster.integrations import autohook

        autohook.install()


try:
    start()
except Exception as exc:  # noqa: BLE001 - an interpreter must start whatever happens here
    print(f"muster: the trial's start-up hook failed ({type(exc).__name__}: {exc}); "
          "integrations are off in this process", file=sys.stderr)
