"""`core_context.preempt`: muster's request to stop, as Determined's preemption signal.

muster asks a trial to stop (pause, kill, a searcher's early stop) with SIGTERM to every
rank, then SIGKILL after `failure_policy.stop_grace`; the harness turns SIGTERM into a flag
(`muster.harness.stopping`). `should_preempt()` reads that flag the way Determined reads
its master's signal: by default the chief reads it and every rank gets the chief's answer,
so all ranks stop at the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from ._distributed import DistributedContext


class PreemptMode(str, Enum):
    """Who reads the signal: the chief for everyone (`WorkersAskChief`, every rank calls
    `should_preempt()` in step), the chief alone (`ChiefOnly`), or each rank its own
    (`WorkersAskMaster`: every rank gets muster's SIGTERM)."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Whether muster has asked this trial to stop."""

    def __init__(self, requested: Callable[[], bool], distributed: DistributedContext,
                 preempt_mode: PreemptMode = PreemptMode.WorkersAskChief) -> None:
        self._requested = requested
        self._dist = distributed
        self._mode = PreemptMode(preempt_mode)

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True once muster asked the trial to stop: save a checkpoint and exit.

        `auto_ack` changes nothing here: the harness records when the loop first saw the
        request (stop-ack.json) either way, and muster, which asked, knows the trial is to
        be resumed later (a pause) or not (a kill, a searcher's stop).

        Raises:
            RuntimeError: a worker calls it with `preempt_mode=ChiefOnly`.
        """
        if self._mode is PreemptMode.WorkersAskMaster:
            return self._requested()
        if self._dist.rank != 0:
            if self._mode is PreemptMode.ChiefOnly:
                raise RuntimeError(f"should_preempt() called on rank {self._dist.rank} with "
                                   "preempt_mode=ChiefOnly: only the chief (rank 0) may call it")
            return bool(self._dist.broadcast(None))
        answer = self._requested()
        if self._mode is PreemptMode.WorkersAskChief:
            self._dist.broadcast(answer)
        return answer

    def acknowledge_preemption_signal(self) -> None:
        """Nothing to do: muster asked for the stop, so an exit after it is not taken for
        the trial's end (see `should_preempt`)."""
