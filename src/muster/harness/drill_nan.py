"""The harness's side of a drill's "nan" fault (`muster drill`, `muster.drill.inject`).

The drill asks for it from outside the training process by writing the rank's
`RankFile.DRILL_NAN`. The background thread looks for that file once a second (`check`) and
arms the request; the next report then has its loss made NaN (`apply`: `report` reads one
attribute, never the file system). The thread's next look writes what was changed to
`RankFile.DRILL_NAN_DONE` (atomically) and removes the request. Off the platform nothing
is looked for.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from muster.atomic import atomic_write_json
from muster.rundir import RankFiles

__all__ = ["CHECK_INTERVAL_S", "NanRequest", "loss_name"]

CHECK_INTERVAL_S = 1.0


class NanRequest:
    """A drill's request to make the next reported loss NaN, for one rank.

    `armed` is set by the background thread and cleared by the training loop's `apply`,
    which records what it changed before it clears it: the two never race on one field.
    """

    def __init__(self, files: RankFiles | None) -> None:
        self.armed = False
        self._files = files  # None: a local run, which no drill asks anything of
        self._applied: dict[str, object] | None = None

    def check(self) -> None:
        """Record an applied request, or arm a new one (the background thread's task)."""
        if self._files is None:
            return
        applied = self._applied
        if applied is not None:
            atomic_write_json(self._files.drill_nan_done, applied)
            self._files.drill_nan.unlink(missing_ok=True)
            self._applied = None
        elif not self.armed and os.path.exists(self._files.drill_nan) \
                and not os.path.exists(self._files.drill_nan_done):
            self.armed = True

    def apply(self, kind: str, step: object,
              metrics: Mapping[str, object]) -> Mapping[str, object]:
        """`metrics` with its loss (`loss_name`) made NaN, once; unchanged when it has no
        number to change (the request then waits for the next report)."""
        name = loss_name(metrics)
        if name is None:
            return metrics
        self._applied = {"step": step, "metric": name, "kind": str(kind)}
        self.armed = False
        return {**metrics, name: math.nan}


def loss_name(metrics: Mapping[str, object]) -> str | None:
    """The metric a drill makes NaN: `loss`, else the first whose name contains "loss" (any
    case), else the first number; None when there is none."""
    if "loss" in metrics:
        return "loss"
    for name in metrics:
        if "loss" in name.lower():
            return name
    for name, value in metrics.items():
        if _is_number(value):
            return name
    return None


def _is_number(value: object) -> bool:
    """A number the report accepts: an int or float (not a bool), or a 0-d scalar."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) or getattr(value, "ndim", None) == 0
