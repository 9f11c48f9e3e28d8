"""What training code imports: `init()`, then metrics, heartbeats, samples, checkpoints, stop.

```python
import muster.harness as mh

with mh.init() as ctx:
    start = ctx.checkpoint.restore()              # latest intact checkpoint, or None
    for step in range(start.step + 1 if start else 0, steps):
        ...
        ctx.samples.seen(len(batch), epoch=epoch)
        ctx.report_training(step, {"loss": loss})
        if ctx.should_stop():                       # muster's SIGTERM: save and leave
            with ctx.checkpoint.save(step) as path:
                torch.save(state, path / "state.pt")
            break
```

Sharded state (FSDP, torch.distributed.checkpoint) is saved by every rank together:
`with ctx.checkpoint.save_sharded(step) as path: dcp.save(state, checkpoint_id=path)`, or in
the background with `ctx.checkpoint.save_sharded_async(step, start)`.

The same script runs off the platform with plain `python train.py`, writing into
`./muster-run/` (`muster.rundir.LOCAL_RUN_DIR`). The files it writes are described in
docs/run-directory.md. Importing this package is cheap: it needs only the standard
library. PyTorch loops resume exactly with `muster.harness.torch` (`save`, `restore`,
`should_stop`), imported on its own.
"""

from muster.harness.checkpoints import Checkpoint, CheckpointError
from muster.harness.context import Context, init
from muster.harness.sharded import PendingSave

__all__ = ["Checkpoint", "CheckpointError", "Context", "PendingSave", "init"]
