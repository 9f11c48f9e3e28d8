"""Determined's Core API, served by muster: what a trial imports as `determined`.

A trial whose config says `compat: determined` finds this package first on its path
(`muster.startup`), so a script written for Determined's Core API runs unchanged:

```python
import determined as det

with det.core.init() as core_context:
    info = det.get_cluster_info()
    ...
    core_context.train.report_validation_metrics(steps_completed=n, metrics={...})
    with core_context.checkpoint.store_path({"steps_completed": n}) as (path, storage_id):
        ...
    if core_context.preempt.should_preempt():
        return
```

It is muster's own code, written from Determined's public documentation and behaviour, over
`muster.harness`: metrics land in the rank's metrics file, checkpoints are muster's, the
preemption signal is muster's SIGTERM, ranks talk over torch.distributed. What muster cannot
serve raises `NotImplementedError` naming the call and why; a part of Determined's package
that is not here (`determined.pytorch`, ...) fails to import with its reason. The coverage
is docs/how-to/coming-from-determined.md's. Importing it needs only the standard library;
torch is imported by the collectives of a job of several ranks.
"""

from . import core, errors
from ._info import ClusterInfo, TrialInfo, get_cluster_info
from ._unprovided import install_finder, missing_attribute
from .errors import InvalidHP

__all__ = ["LOG_FORMAT", "ClusterInfo", "InvalidHP", "TrialInfo", "core", "errors",
           "get_cluster_info"]

# The Determined release whose Core API this serves, marked as muster's.
__version__ = "0.38.1+muster"
# The log format Determined's examples pass to logging.basicConfig.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

install_finder(__name__)


def __getattr__(name: str) -> object:
    raise missing_attribute(__name__, name)
