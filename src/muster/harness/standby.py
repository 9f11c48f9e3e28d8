"""A warm standby waits in `init()` until muster promotes it to be the trial's next attempt.

With `failure_policy.warm_standby`, muster starts the next attempt's replicas while the
current one runs. Everything the script does before `muster.harness.init()` (imports,
loading data, building the model) is then done ahead of a failure; `init()` blocks here
until muster writes the go file named by MUSTER_STANDBY_GO, whose `env` holds the final
values (e.g. MUSTER_LATEST_CHECKPOINT: the checkpoint to resume from is known only when
the failure happens; null removes a variable). Without MUSTER_STANDBY_GO this does nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import MutableMapping
from pathlib import Path

from muster.atomic import read_json
from muster.jobenv import STANDBY_GO

POLL_S = 0.005


def wait_for_promotion(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Block until promoted, apply the go file's environment; False when not a standby.

    A standby that muster no longer needs is stopped with SIGTERM while it waits here (the
    harness's own SIGTERM handler is not installed yet, so it simply ends).

    Raises:
        ValueError: the go file is not what muster writes.
    """
    go = environ.get(STANDBY_GO)
    if not go:
        return False
    path = Path(go)
    while (document := read_json(path)) is None:
        time.sleep(POLL_S)
    changes = document.get("env") if isinstance(document, dict) else None
    if not isinstance(changes, dict):
        raise ValueError(f"{path} has no 'env' object; it is not a muster go file")
    for name, value in changes.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = str(value)
    environ.pop(STANDBY_GO, None)
    return True
