"""Determined's Core API: `det.core.init()` and the parts of the context it gives.

Served by muster (see the package's docstring and docs/how-to/coming-from-determined.md for
what each call does here, and which are not supported).
"""

from ._checkpoint import CheckpointContext, DownloadMode
from ._context import Context, init
from ._distributed import DistributedContext, DummyDistributedContext
from ._experimental import ExperimentalCoreContext
from ._preempt import PreemptContext, PreemptMode
from ._profiler import ProfilerContext
from ._searcher import SearcherContext, SearcherMode, SearcherOperation, Unit
from ._train import EarlyExitReason, TensorboardMode, TrainContext

__all__ = [
    "CheckpointContext", "Context", "DistributedContext", "DownloadMode",
    "DummyDistributedContext", "EarlyExitReason", "ExperimentalCoreContext", "PreemptContext",
    "PreemptMode", "ProfilerContext", "SearcherContext", "SearcherMode", "SearcherOperation",
    "TensorboardMode", "TrainContext", "Unit", "init",
]
