"""The Hugging Face `Trainer`: the full harness from `TrainerState` and the Trainer's saves.

```python
from muster.integrations.transformers import MusterCallback
trainer = Trainer(model, args, train_dataset=..., callbacks=[MusterCallback()])
trainer.train()                  # resumes from muster's latest checkpoint by itself
```

With `integrations: auto` (the default for scripts without `harness: true`) the trial's
import hook adds the callback to every `Trainer` (`attach`): nothing in the script changes.

What the callback maps:

- check-in: `train` opens the harness (or joins the script's own `init()` block);
- planned length: `state.max_steps` (optimizer steps, from `max_steps` or the epochs); an
  `EarlyStoppingCallback` that ends training sooner sets the plan to where it ended;
- metrics: every `log` (`log_history`'s entries) at `state.global_step`: an evaluation's
  (`eval_*`) as validation, the rest as training; a last training report at the end
  records the final step;
- progress: a heartbeat per optimizer step (the Trainer does not say a batch's size, so
  samples are not counted: verify epochs with `verify.expected_length` in steps instead);
- checkpoints: each `checkpoint-<step>/` the Trainer saves is published as a muster
  checkpoint (its files copied, hashed, stored, GC'd) by the world's process zero;
  `train()` without `resume_from_checkpoint` resumes from muster's latest;
- stops: muster's SIGTERM (pause, kill, the searcher) sets `should_save` and
  `should_training_stop`: the Trainer saves a checkpoint, then ends training.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from muster.integrations import patching
from muster.integrations.session import Session
from muster.states import Integration

__all__ = ["attach", "callback_class", "publish_directory"]

CHECKPOINT_METADATA = "transformers"  # the key of a checkpoint's metadata this module writes
_made: list[type] = []


class _Hooks:
    """The callback's hooks (mixed into `transformers.TrainerCallback`)."""

    def __init__(self) -> None:
        self.session = Session(Integration.TRANSFORMERS)
        self._stop_seen = False

    def resume_path(self) -> str | None:
        """muster's latest checkpoint's Trainer folder, when it has one."""
        found = self.session.resumable(CHECKPOINT_METADATA, "folder")
        return found.said("the Trainer") if found is not None and found.path.is_dir() else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session.start() is not None and state.max_steps and state.max_steps > 0:
            self.session.plan("steps", int(state.max_steps))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ctx = self.session.context
        if ctx is None:
            return
        try:
            ctx.heartbeat(state.global_step)
            if not self._stop_seen and ctx.should_stop():
                self._stop_seen = True
                control.should_save = True
                control.should_training_stop = True
        except Exception as exc:  # noqa: BLE001 - the rule: never break the script
            self.session.fail("noting progress", exc)

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        # An evaluation's log (its `eval_*` and the epoch) is a validation; the summary
        # `train()` logs at its end (train_runtime...) repeats what was reported.
        if not logs or "train_runtime" in logs:
            return
        validation = any(name.startswith("eval_") for name in logs)
        self.session.report(validation, state.global_step, logs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        with self.session.guard(f"publishing {folder}"):
            if folder.is_dir():
                publish_directory(self.session, folder, state.global_step, CHECKPOINT_METADATA,
                                  {"epoch": state.epoch})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.report(False, state.global_step, {"epoch": state.epoch or 0})
        if (not self._stop_seen and control.should_training_stop
                and state.global_step < state.max_steps and _stopped_early(kwargs)):
            self.session.plan("steps", max(1, state.global_step))
            print(f"muster: the Trainer's EarlyStoppingCallback ended training at step "
                  f"{state.global_step}: that is the planned length now", file=sys.stderr,
                  flush=True)


def publish_directory(session: Session, folder: Path, step: int, key: str,
                      facts: Mapping[str, Any]) -> None:
    """Publish `folder` (a framework's checkpoint directory) as a muster checkpoint holding
    a copy of it under its own name, hashed. A copy, never a link: a framework may write
    into its directory again (`save_state` to one path each epoch, a step saved twice), and
    a file written in place would change the published checkpoint too."""
    metadata = {key: {"folder": folder.name, **facts}}
    with session.saving(step, metadata) as directory:
        if directory is not None:
            _copy_tree(folder, directory / folder.name)


def _copy_tree(source: Path, target: Path) -> None:
    target.mkdir()
    for entry in sorted(source.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            _copy_tree(entry, target / entry.name)
        elif entry.is_file() and not entry.is_symlink():
            shutil.copyfile(entry, target / entry.name)


def _stopped_early(kwargs: Mapping[str, Any]) -> bool:
    """Whether an EarlyStoppingCallback of the Trainer ran out of patience."""
    handler = kwargs.get("callback_handler")
    callbacks = getattr(handler, "callbacks", ()) if handler is not None else ()
    return any(type(c).__name__ == "EarlyStoppingCallback"
               and getattr(c, "early_stopping_patience_counter", 0)
               >= getattr(c, "early_stopping_patience", 1) for c in callbacks)


def callback_class() -> type:
    """`MusterCallback` on transformers' `TrainerCallback`, made once; `Trainer.train` then
    resumes from muster."""
    if not _made:
        transformers = importlib.import_module("transformers")
        _made.append(type("MusterCallback", (_Hooks, transformers.TrainerCallback),
                          {"__module__": __name__,
                           "__doc__": "muster's harness for a Hugging Face Trainer."}))
        _wrap_train(transformers.Trainer)
    return _made[0]


def _wrap_train(trainer_class: type) -> None:
    """`Trainer.train` without `resume_from_checkpoint` resumes from muster's latest
    checkpoint when the trainer carries muster's callback."""
    patching.resuming(trainer_class, "train", "resume_from_checkpoint", 0, _resume_path)


def _resume_path(trainer: Any) -> str | None:
    ours = next((c for c in trainer.callback_handler.callbacks if isinstance(c, _Hooks)), None)
    if ours is None:
        return None
    with ours.session.guard("finding the checkpoint to resume from"):
        return ours.resume_path()
    return None


def attach(module: ModuleType) -> None:
    """The import hook's part (`muster.integrations.autohook`): every `Trainer` gets
    muster's callback when made without one."""

    def add(trainer: Any) -> None:
        callback = callback_class()
        if not any(isinstance(c, callback) for c in trainer.callback_handler.callbacks):
            trainer.add_callback(callback())

    patching.after_init(module.Trainer, add)


def __getattr__(name: str) -> type:
    """`MusterCallback`, made at first use (importing transformers)."""
    if name != "MusterCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return callback_class()
