"""`core_context.searcher`: Determined's (deprecated) searcher operations, from muster's
`searcher.max_length`.

Since Determined 0.38 `operations()` no longer asks a master: it yields one operation whose
`length` is the config's `searcher.max_length`, and warns that it is deprecated. muster
hands a trial its `max_length` as MUSTER_MAX_LENGTH, so a trial gets that one operation the
same way. Without a `max_length` a trial on the platform has no searcher context (its calls
raise, as Determined's do); a run off the platform gets one operation of length 1, as
Determined's off-cluster one does. Progress and completion change nothing in muster: its
searcher reads the config's `searcher.metric` from the reported validation metrics, and the
progress muster shows is measured from the steps reported.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

from ._distributed import DistributedContext

_DEPRECATED = ("core_context.searcher.operations() is deprecated since Determined 0.38: "
               "say how long to train in the training code instead")
_MISSING = ("this trial has no searcher context: its config sets no searcher.max_length "
            "(MUSTER_MAX_LENGTH is unset). The searcher context is deprecated since Determined "
            "0.38: say how long to train in the training code instead")


class Unit(str, Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class SearcherMode(str, Enum):
    """Who calls `operations()`: every rank in step (`WorkersAskChief`: the chief hands
    the others each operation) or the chief alone (`ChiefOnly`)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"  # Determined's spelling, so the value means the same there


class SearcherOperation:
    """Train until `length` (absolute, in the unit the config's max_length counts), validate,
    then `report_completed`."""

    def __init__(self, length: int, is_chief: bool, on_progress: Callable[[], None]) -> None:
        self._length = length
        self._is_chief = is_chief
        self._on_progress = on_progress
        self._completed = False

    @property
    def length(self) -> int:
        return self._length

    def report_progress(self, length: float) -> None:
        """Count as progress (a heartbeat); muster measures how far the trial is itself.

        Raises:
            RuntimeError: called on a worker, or after `report_completed` with a new length.
        """
        if not self._is_chief:
            raise RuntimeError("op.report_progress() may only be called on the chief (rank 0)")
        if self._completed and length != self._length:
            raise RuntimeError("op.report_progress() after op.report_completed()")
        self._on_progress()

    def report_completed(self, searcher_metric: Any) -> None:
        """End the operation. muster's searcher reads `searcher.metric` from the validation
        metrics reported, not from this value.

        Raises:
            RuntimeError: called on a worker, or twice.
        """
        if not self._is_chief:
            raise RuntimeError("op.report_completed() may only be called on the chief (rank 0)")
        if self._completed:
            raise RuntimeError("op.report_completed() may only be called once")
        self._completed = True


class SearcherContext:
    """The one operation of length `max_length`; None means the trial has no searcher
    context, and its calls raise ValueError, as Determined's do."""

    def __init__(self, distributed: DistributedContext, max_length: int | None,
                 on_progress: Callable[[], None]) -> None:
        self._dist = distributed
        self._length = max_length
        self._on_progress = on_progress

    def operations(self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
                   auto_ack: bool = True) -> Iterator[SearcherOperation]:
        """Yield the trial's one operation (on workers in `WorkersAskChief` mode, the
        chief's, handed over in step with it).

        Raises:
            ValueError: the trial has no max_length.
            RuntimeError: a worker calls it in `ChiefOnly` mode, or the chief leaves an
                operation without `report_completed`.
        """
        warnings.warn(_DEPRECATED, FutureWarning, stacklevel=2)
        length = self._configured_length()
        mode = SearcherMode(searcher_mode)
        if self._dist.rank == 0:
            yield from self._chief_operations(length, mode)
        elif mode is SearcherMode.ChiefOnly:
            raise RuntimeError("searcher.operations(searcher_mode=ChiefOnly) called on rank "
                               f"{self._dist.rank}: only the chief (rank 0) may call it")
        else:
            while (handed := self._dist.broadcast(None)) is not None:
                yield SearcherOperation(handed, False, self._on_progress)

    def acknowledge_out_of_ops(self) -> None:
        """Deprecated in Determined 0.38 and ignored there too."""
        self._configured_length()

    def get_configured_units(self) -> Unit | None:
        """None: muster hands a trial its max_length as a number, without its unit."""
        self._configured_length()
        return None

    def _chief_operations(self, length: int, mode: SearcherMode) -> Iterator[SearcherOperation]:
        op = SearcherOperation(length, True, self._on_progress)
        if mode is SearcherMode.WorkersAskChief:
            self._dist.broadcast(length)
        yield op
        if not op._completed:
            raise RuntimeError("call op.report_completed() on each searcher operation")
        if mode is SearcherMode.WorkersAskChief:
            self._dist.broadcast(None)

    def _configured_length(self) -> int:
        if self._length is None:
            raise ValueError(_MISSING)
        return self._length
