"""`det.core.init()` and the `Context` it gives: Determined's Core API over `muster.harness`.

`init()` opens the harness for the process (or joins the block a script or an integration
opened already), and the context's parts report through it: metrics into the rank's
metrics file, checkpoints into the trial's checkpoint directory, muster's SIGTERM as the
preemption signal. Off the platform it is a local run writing into ./muster-run/, where
Determined's off-cluster `init()` logs and saves under its own user directory.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from .. import _info, _run
from .._unprovided import unprovided
from ._checkpoint import CheckpointContext
from ._distributed import DistributedContext, DummyDistributedContext
from ._experimental import ExperimentalCoreContext
from ._preempt import PreemptContext, PreemptMode
from ._profiler import ProfilerContext
from ._searcher import SearcherContext
from ._train import TensorboardMode, TrainContext

if TYPE_CHECKING:
    from muster.harness.context import Context as HarnessContext

# Determined's searcher off its cluster: one operation of length 1.
OFF_PLATFORM_LENGTH = 1


class Context:
    """What `det.core.init()` gives: `.train`, `.checkpoint`, `.preempt`, `.searcher`,
    `.distributed`, `.info` (None off the platform), `.profiler`, `.experimental`.

    Use it as `with det.core.init() as core_context:`; leaving the block ends the
    harness's part (the last metrics written) and lets go of the collectives' groups.
    """

    def __init__(self, *, train: TrainContext, checkpoint: CheckpointContext,
                 preempt: PreemptContext, searcher: SearcherContext,
                 distributed: DistributedContext, info: _info.ClusterInfo | None,
                 close: Callable[[], None]) -> None:
        self.train = train
        self.checkpoint = checkpoint
        self.preempt = preempt
        self.searcher = searcher
        self.distributed = distributed
        self.info = info
        self.profiler = ProfilerContext()
        self.experimental = ExperimentalCoreContext()
        self._close = close

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """End what `init()` opened (idempotent). An `det.InvalidHP` leaving the block is
        not turned into an exit 0 as on Determined: the trial fails with its message."""
        self._close()

    def alert(self, title: str | None = None, description: str | None = None,
              level: str | None = "info") -> NoReturn:
        raise unprovided("Context.alert", "muster sends no webhooks from a trial; its "
                         "events are in `muster trial events`")


def init(*, distributed: DistributedContext | None = None,
         checkpoint_storage: str | dict[str, Any] | None = None,
         preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
         tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
         async_checkpointing: bool = False) -> Context:
    """Connect this rank to muster; use as `with det.core.init() as core_context:`.

    Args:
        distributed: required where the trial runs more than one rank
            (`DistributedContext.from_torch_distributed()`), as on Determined.
        checkpoint_storage: ignored with a warning: checkpoints go to the trial's run
            directory, and muster's server stores them as the experiment config's
            `checkpoint_storage` says.
        preempt_mode: who reads muster's stop request (`PreemptMode`).
        tensorboard_mode: accepted; muster collects no TensorBoard files either way.
        async_checkpointing: accepted (from other Determined versions); saves finish
            before `store_path`'s block is left.

    Raises:
        ValueError: several ranks and no `distributed`, or one that does not match the
            rank muster started; a malformed muster variable.
    """
    if checkpoint_storage is not None:
        warnings.warn("det.core.init(checkpoint_storage=...) is ignored under muster: "
                      "checkpoints go to the trial's run directory, and muster stores them "
                      "as the experiment config's checkpoint_storage says",
                      RuntimeWarning, stacklevel=2)
    stack = ExitStack()
    try:
        harness = _harness_block(stack)
        ranks = _checked_distributed(distributed, harness)
        stack.callback(ranks.close)
        return _context(harness, ranks, PreemptMode(preempt_mode),
                        TensorboardMode(tensorboard_mode), stack.close)
    except BaseException:
        stack.close()
        raise


def _harness_block(stack: ExitStack) -> HarnessContext:
    """The harness block already open in this process, else one opened on `stack`."""
    from muster.harness import context as harness_context
    from muster.states import Integration

    joined = harness_context.active()
    if joined is not None:
        return joined
    return stack.enter_context(harness_context.init(integration=Integration.DETERMINED))


def _checked_distributed(distributed: DistributedContext | None,
                         harness: HarnessContext) -> DistributedContext:
    if distributed is None:
        if harness.world_size > 1:
            raise ValueError(
                f"this trial runs {harness.world_size} ranks: pass det.core.init(distributed="
                "det.core.DistributedContext.from_torch_distributed()), as Determined requires "
                "for a task of several slots")
        return DummyDistributedContext()
    if (distributed.rank, distributed.size) != (harness.rank, harness.world_size):
        raise ValueError(f"the DistributedContext says rank {distributed.rank} of "
                         f"{distributed.size}, but muster started this process as rank "
                         f"{harness.rank} of {harness.world_size} (RANK, WORLD_SIZE)")
    return distributed


def _context(harness: HarnessContext, ranks: DistributedContext, preempt_mode: PreemptMode,
             tensorboard_mode: TensorboardMode, close: Callable[[], None]) -> Context:
    length = harness.max_length
    if length is None and not _run.on_platform():
        length = OFF_PLATFORM_LENGTH

    def progress() -> None:
        harness.heartbeat()

    return Context(
        train=TrainContext(harness, tensorboard_mode),
        checkpoint=CheckpointContext(harness.checkpoint, ranks, _run.storage_ids()),
        preempt=PreemptContext(harness.should_stop, ranks, preempt_mode),
        searcher=SearcherContext(ranks, length, progress),
        distributed=ranks,
        info=_info.get_cluster_info(),
        close=close,
    )
