"""Hugging Face Accelerate: a tracker for `accelerator.log`, and `save_state`/`load_state`
as muster checkpoints.

```python
from muster.integrations.accelerate import MusterTracker
tracker = MusterTracker(steps=epochs * len(loader))      # the planned length, if known
accelerator = Accelerator(log_with=[tracker])
accelerator.init_trackers("digits")
accelerator.load_state()          # muster's latest checkpoint, when there is one
for step, batch in ...:
    ...; accelerator.log({"loss": loss.item()}, step=step)
    if tracker.should_stop(): accelerator.save_state("ckpt"); break
accelerator.save_state("ckpt")    # published as a muster checkpoint
accelerator.end_training()
```

Accelerate's loop is the script's own, so there is no length to read from it: give
`steps=` (or `epochs=`) to the tracker, set `verify.expected_length`, or let the searcher's
`max_length` say it. Every rank reports its own metrics (muster compares ranks); a name
that starts with `val`, `eval` or `test` (or holds `/val`, `/eval`, `/test`) is a
validation metric, the rest training.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from muster.integrations.session import Session
from muster.integrations.transformers import publish_directory
from muster.states import Integration

__all__ = ["is_validation", "tracker_class"]

CHECKPOINT_METADATA = "accelerate"  # the key of a checkpoint's metadata this module writes
_VALIDATION_PREFIXES = ("val", "eval", "test")
_WRAPPED = "__muster_wrapped__"
_made: list[type] = []


def is_validation(name: str) -> bool:
    """Whether a logged name is a validation metric (`val_loss`, `eval/acc`, `test_f1`)."""
    leaf = name.lower()
    return leaf.startswith(_VALIDATION_PREFIXES) or any(
        f"/{prefix}" in leaf for prefix in _VALIDATION_PREFIXES)


class _Tracker:
    """The tracker's methods (mixed into Accelerate's `GeneralTracker`)."""

    name = "muster"
    requires_logging_directory = False
    main_process_only = False  # each rank reports its own (muster compares them)

    def __init__(self, steps: int | None = None, epochs: int | None = None) -> None:
        super().__init__()
        self.session = Session(Integration.ACCELERATE)
        self._length = ("steps", steps) if steps is not None else (
            ("epochs", epochs) if epochs is not None else None)
        self.last_step = 0

    @property
    def tracker(self) -> Any:
        """The harness context (`muster.harness.Context`), once started."""
        return self.session.context

    def start(self) -> None:
        if self.session.start() is not None and self._length is not None:
            self.session.plan(*self._length)

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """muster has the trial's hyperparameters already."""

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.session.start()
        at = self.last_step if step is None else step
        self.last_step = at
        validation = {k: v for k, v in values.items() if is_validation(k)}
        training = {k: v for k, v in values.items() if not is_validation(k)}
        if training:
            self.session.report(False, at, training)
        if validation:
            self.session.report(True, at, validation)

    def should_stop(self) -> bool:
        """True once muster asked the run to stop (pause, kill, the searcher): save the
        state and leave the loop."""
        return self.session.should_stop()

    def finish(self) -> None:
        self.session.close()


def tracker_class() -> type:
    """`MusterTracker` on Accelerate's `GeneralTracker`, made once; `Accelerator.save_state`
    and `load_state` then go through muster's checkpoints."""
    if not _made:
        tracking = importlib.import_module("accelerate.tracking")
        accelerate = importlib.import_module("accelerate")
        _made.append(type("MusterTracker", (_Tracker, tracking.GeneralTracker),
                          {"__module__": __name__, "__doc__": _Tracker.__doc__}))
        _wrap_states(accelerate.Accelerator)
    return _made[0]


def _ours(accelerator: Any) -> _Tracker | None:
    found = [*getattr(accelerator, "trackers", ()), *(getattr(accelerator, "log_with", ()) or ())]
    return next((t for t in found if isinstance(t, _Tracker)), None)


def _wrap_states(accelerator_class: type) -> None:
    """`save_state` publishes what it wrote (on the main process); `load_state()` without a
    directory loads muster's latest checkpoint (once per class)."""
    save, load = accelerator_class.save_state, accelerator_class.load_state  # type: ignore[attr-defined]
    if getattr(save, _WRAPPED, False):
        return

    def save_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        location = save(self, *args, **kwargs)
        ours = _ours(self)
        if ours is not None and self.is_main_process and location:
            with ours.session.guard(f"publishing {location}"):
                publish_directory(ours.session, Path(location), ours.last_step,
                                  CHECKPOINT_METADATA, {})
        return location

    def load_state(self: Any, input_dir: str | None = None, *args: Any, **kwargs: Any) -> Any:
        ours = _ours(self)
        if input_dir is None and ours is not None:
            input_dir = _latest(ours)
            if input_dir is None:
                print("muster: no checkpoint to resume from: the run starts afresh",
                      file=sys.stderr, flush=True)
                return None
        return load(self, input_dir, *args, **kwargs)

    for wrapper, original in ((save_state, save), (load_state, load)):
        setattr(wrapper, _WRAPPED, True)
        wrapper.__doc__ = original.__doc__
        setattr(accelerator_class, original.__name__, wrapper)


def _latest(tracker: _Tracker) -> str | None:
    """muster's latest checkpoint's Accelerate directory, when there is one."""
    found = tracker.session.resumable(CHECKPOINT_METADATA, "folder")
    if found is None or not found.path.is_dir():
        return None
    tracker.last_step = found.checkpoint.step
    return found.said("Accelerate")


def __getattr__(name: str) -> type:
    """`MusterTracker`, made at first use (importing accelerate)."""
    if name != "MusterTracker":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return tracker_class()
