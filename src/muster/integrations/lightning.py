"""PyTorch Lightning 2.x (`lightning.pytorch` and `pytorch_lightning`): the full harness from
the trainer's own state.

```python
from muster.integrations.lightning import MusterCallback
trainer = L.Trainer(max_epochs=10, callbacks=[MusterCallback()])
trainer.fit(model, data)          # resumes from muster's latest checkpoint by itself
```

With `integrations: auto` (the default for scripts without `harness: true`) the trial's
import hook adds the callback to every `Trainer` (`attach`): nothing in the script changes.

What the callback maps:

- check-in: `fit` opens the harness (or joins the script's own `init()` block);
- planned length: `trainer.estimated_stepping_batches` (from `max_steps`, or `max_epochs`
  times batches per epoch), else `max_epochs`; an `EarlyStopping` or `max_time` that ends
  training sooner sets the plan to where it ended (the script's own planned end);
- metrics: what Lightning sends its loggers, under Lightning's names, as training or
  validation by the loop that logged them, at `trainer.global_step` (optimizer steps done);
  a last training report at the end of `fit` records the final step;
- samples: each batch's size per epoch on every rank;
- checkpoints: every save through the strategy's `CheckpointIO` (ModelCheckpoint,
  `trainer.save_checkpoint`) is written into a muster checkpoint (atomic, hashed, stored,
  GC'd) and linked where Lightning asked for it; `fit` without `ckpt_path` resumes from
  muster's latest full checkpoint;
- stops: muster's SIGTERM (pause, kill, the searcher) sets `trainer.should_stop`; the run
  saves a checkpoint before it leaves, also when Lightning's own SIGTERM handling raises.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from muster.integrations import patching
from muster.integrations.session import Session
from muster.states import Integration

__all__ = ["attach", "batch_size", "classes_for"]  # and MusterCallback, MusterLogger (lazy)

PACKAGES = ("lightning.pytorch", "pytorch_lightning")
CHECKPOINT_METADATA = "lightning"  # the key of a checkpoint's metadata this module writes
_classes: dict[str, tuple[type, type, type]] = {}


class _Hooks:
    """The callback's hooks (mixed into the package's `Callback` by `classes_for`)."""

    _package: str

    def __init__(self) -> None:
        self.session = Session(Integration.LIGHTNING)
        self.validating = False
        self.trainer: Any = None
        self._stop_saved = False

    # -- fit ------------------------------------------------------------------------------

    def resume_path(self) -> str | None:
        """muster's latest checkpoint's Lightning file, when it can resume training."""
        found = self.session.resumable(CHECKPOINT_METADATA, "file")
        if found is None or not found.path.is_file():
            return None
        if not found.facts.get("resumable", False):
            print(f"muster: the latest checkpoint ({found.checkpoint.path.name}) holds weights "
                  "only; Lightning starts without it", file=sys.stderr, flush=True)
            return None
        return found.said("Lightning")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.session.start() is None:
            return
        with self.session.guard("connecting to the trainer"):
            self.trainer = trainer
            logger_class, io_class = _classes[self._package][1:]
            if not any(isinstance(logger, logger_class) for logger in trainer.loggers):
                trainer.loggers = [*trainer.loggers, logger_class(self)]
            if not isinstance(trainer.strategy.checkpoint_io, io_class):
                trainer.strategy.checkpoint_io = io_class(trainer.strategy.checkpoint_io,
                                                          self.session)
            bypassed = saves_around_checkpoint_io(trainer.strategy)
            if bypassed is not None and trainer.is_global_zero:
                print(f"muster: {bypassed}", file=sys.stderr, flush=True)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        with self.session.guard("reading the planned length"):
            steps = trainer.estimated_stepping_batches
            if isinstance(steps, int) or (isinstance(steps, float) and steps.is_integer()):
                self.session.plan("steps", int(steps))
            elif trainer.max_epochs is not None and trainer.max_epochs > 0:
                self.session.plan("epochs", int(trainer.max_epochs))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        ctx = self.session.context
        if ctx is None:
            return
        try:
            size = batch_size(batch)
            if size:
                ctx.samples.seen(size, epoch=trainer.current_epoch)
            else:
                ctx.heartbeat(trainer.global_step)
            if ctx.should_stop():
                trainer.should_stop = True
        except Exception as exc:  # noqa: BLE001 - the rule: never break the script
            self.session.fail("counting samples", exc)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.validating = not trainer.sanity_checking

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.validating = False

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """The last step reached, and the stop's checkpoint or the early end's plan."""
        self.session.report(False, trainer.global_step, {"epoch": trainer.current_epoch})
        if self.session.should_stop():
            self._save_for_stop(trainer)
        elif trainer.should_stop and _ended_by_the_script(trainer):
            self.session.plan("steps", max(1, trainer.global_step))
            print(f"muster: Lightning's own stopping ended training at step "
                  f"{trainer.global_step}: that is the planned length now", file=sys.stderr,
                  flush=True)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        sigterm = importlib.import_module(f"{self._package}.utilities.exceptions")
        if isinstance(exception, sigterm.SIGTERMException) or self.session.should_stop():
            self.session.should_stop()  # acknowledges muster's stop
            self._save_for_stop(trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self.session.close()

    def _save_for_stop(self, trainer: Any) -> None:
        """A checkpoint to resume from, once, when muster stops the run."""
        if self._stop_saved or self.session.context is None:
            return
        self._stop_saved = True
        directory = Path(trainer.default_root_dir) / "checkpoints"
        with self.session.guard("saving the checkpoint muster's stop asked for"):
            trainer.save_checkpoint(directory / f"muster-stop-step={trainer.global_step}.ckpt")


class _LoggerMethods:
    """The logger's methods (mixed into the package's `Logger`): what Lightning logs, as
    muster's training or validation reports. It names no directory of its own, so a
    trainer that had no logger keeps its checkpoints where it would have."""

    def __init__(self, hooks: _Hooks) -> None:
        super().__init__()
        self._hooks = hooks

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str | None:
        trainer = self._hooks.trainer
        return None if trainer is None else str(trainer.default_root_dir)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        trainer = self._hooks.trainer
        at = trainer.global_step if trainer is not None else step
        if at is not None:
            self._hooks.session.report(self._hooks.validating, int(at), metrics)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """muster has the trial's hyperparameters already."""


class _CheckpointIOMethods:
    """The strategy's `CheckpointIO`, saving into muster checkpoints (mixed into the
    package's `CheckpointIO`)."""

    def __init__(self, inner: Any, session: Session) -> None:
        self.inner = inner
        self._session = session

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        target = Path(os.fspath(path))
        step = checkpoint.get("global_step")
        before = self._session.published()
        metadata = {CHECKPOINT_METADATA: {
            "file": target.name, "epoch": checkpoint.get("epoch"), "global_step": step,
            "resumable": "optimizer_states" in checkpoint and "loops" in checkpoint}}
        with self._session.saving(step if isinstance(step, int) else 0, metadata) as directory:
            if directory is not None:
                self.inner.save_checkpoint(checkpoint, directory / target.name, storage_options)
        published = self._session.published()
        if directory is None or published is None or published == before:
            self.inner.save_checkpoint(checkpoint, path, storage_options)
            return
        with self._session.guard(f"linking {target} to muster's {published.name}"):
            _place(published / target.name, target)
            return
        self.inner.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return self.inner.load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        """Lightning's copy only: muster's checkpoint stays until muster's GC."""
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


def _place(source: Path, target: Path) -> None:
    """`target` becomes `source`'s file (a hard link, else a copy), replacing what was there
    whole: an overwritten `last.ckpt` never writes into an older muster checkpoint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.muster-{os.getpid()}")
    staging.unlink(missing_ok=True)
    try:
        os.link(source, staging)
    except OSError:
        shutil.copyfile(source, staging)
    os.replace(staging, target)


def _ended_by_the_script(trainer: Any) -> bool:
    """Whether an EarlyStopping or a `max_time` Timer stopped the trainer."""
    for callback in trainer.callbacks:
        kind = type(callback).__name__
        if kind == "EarlyStopping" and getattr(callback, "stopped_epoch", 0) > 0:
            return True
        if kind == "Timer" and callback.time_remaining() is not None \
                and callback.time_remaining() <= 0:
            return True
    return False


def saves_around_checkpoint_io(strategy: Any) -> str | None:
    """Why muster will not see `strategy`'s checkpoints, when it writes them itself rather
    than through its `CheckpointIO` (FSDP with sharded state, DeepSpeed); None otherwise."""
    name = type(strategy).__name__
    if name == "FSDPStrategy" and getattr(strategy, "_state_dict_type", "full") == "sharded":
        what = "FSDPStrategy(state_dict_type='sharded') writes its checkpoints"
    elif name in ("DeepSpeedStrategy", "ModelParallelStrategy"):
        what = f"{name} writes its checkpoints"
    else:
        return None
    return (f"{what} itself, a directory per save, not through the CheckpointIO muster "
            "publishes from: they are not muster checkpoints (not stored, not resumed, and the "
            "trial's verification finds none). Save full state (FSDPStrategy("
            "state_dict_type='full')) or save the shards with ctx.checkpoint.save_sharded")


def batch_size(batch: Any) -> int | None:
    """The number of samples in a batch: the first dimension of its first tensor (in a
    tensor, a sequence or a mapping); None when it holds none."""
    stack, looked = [batch], 0
    while stack and looked < 64:
        item, looked = stack.pop(0), looked + 1
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def classes_for(package: str) -> tuple[type, type, type]:
    """(callback, logger, CheckpointIO) classes on `package`'s bases ("lightning.pytorch"
    or "pytorch_lightning"), made once; its `Trainer.fit` then resumes from muster."""
    made = _classes.get(package)
    if made is None:
        pl = importlib.import_module(package)
        plugins = importlib.import_module(f"{package}.plugins")
        callback = type("MusterCallback", (_Hooks, pl.Callback),
                        {"_package": package, "__module__": __name__,
                         "__doc__": "muster's harness for a Lightning Trainer."})
        logger = type("MusterLogger", (_LoggerMethods, pl.loggers.Logger),
                      {"__module__": __name__, "__doc__": _LoggerMethods.__doc__})
        io = type("MusterCheckpointIO", (_CheckpointIOMethods, plugins.CheckpointIO),
                  {"__module__": __name__, "__doc__": _CheckpointIOMethods.__doc__})
        made = _classes[package] = (callback, logger, io)
        _wrap_fit(pl.Trainer)
    return made


def _wrap_fit(trainer_class: type) -> None:
    """`Trainer.fit` without a `ckpt_path` resumes from muster's latest checkpoint when the
    trainer carries muster's callback."""
    patching.resuming(trainer_class, "fit", "ckpt_path", 4, _resume_path)


def _resume_path(trainer: Any) -> str | None:
    ours = next((c for c in trainer.callbacks if isinstance(c, _Hooks)), None)
    if ours is None:
        return None
    with ours.session.guard("finding the checkpoint to resume from"):
        return ours.resume_path()
    return None


def attach(module: ModuleType) -> None:
    """The import hook's part (`muster.integrations.autohook`): every `Trainer` the module
    defines gets muster's callback when made without one."""
    package = "pytorch_lightning" if module.__name__.startswith("pytorch_") else PACKAGES[0]

    def add(trainer: Any) -> None:
        callback_class = classes_for(package)[0]
        if not any(isinstance(c, callback_class) for c in trainer.callbacks):
            trainer.callbacks.append(callback_class())

    patching.after_init(module.Trainer, add)


def __getattr__(name: str) -> type:
    """`MusterCallback` and `MusterLogger` on `lightning.pytorch` (else `pytorch_lightning`),
    made at first use."""
    index = {"MusterCallback": 0, "MusterLogger": 1}.get(name)
    if index is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    reasons = []
    for package in PACKAGES:
        try:
            return classes_for(package)[index]
        except ImportError as exc:  # the next package may be there; said below if not
            reasons.append(f"{package}: {exc}")
    raise ImportError("muster.integrations.lightning needs the `lightning` or "
                      "`pytorch_lightning` package (2.x): pip install lightning ("
                      + "; ".join(reasons) + ")")
