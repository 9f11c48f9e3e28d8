"""What every integration does with the harness: one context, clean reports, never a crash.

A `Session` opens the harness (`muster.harness.init`) for a framework's run, or joins the
block the script opened itself (`harness: true` with a callback added by hand), and closes
only what it opened. Whatever muster's side of a hook raises is written once to stderr and
turns the integration off for the rest of the process (`Session.guard`): the script then
runs as it would without muster's callback, and verification judges what it did record (a
run without its plan is never verified). Errors of the framework or the script pass through.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muster.harness import context as harness_context
from muster.harness.checkpoints import Checkpoint, CheckpointError
from muster.harness.context import Context
from muster.metrics_lines import name_problem
from muster.states import Integration

__all__ = ["Session", "reportable"]

_BAD_CHARACTERS = re.compile(r"[^A-Za-z0-9_./:@+-]")
_NAMES: dict[str, str | None] = {}  # a framework's metric name -> muster's (None: unusable)
_NAMES_KEPT = 4096


@dataclass(frozen=True)
class Resumable:
    """The part of a checkpoint a framework resumes from (`Session.resumable`)."""

    checkpoint: Checkpoint
    path: Path  # its file or directory, inside the checkpoint
    facts: Mapping[str, Any]  # what the integration noted of the save (its metadata key)

    def said(self, framework: str) -> str:
        """The path, after one line on stderr saying the framework resumes from it."""
        whose = ", the experiment's warm start" if self.checkpoint.warm_start else ""
        print(f"muster: resuming {framework} from {self.path} (step {self.checkpoint.step}"
              f"{whose})", file=sys.stderr, flush=True)
        return str(self.path)


class Session:
    """One framework run's connection to muster, shared by its callback's hooks.

    Attributes:
        integration: which integration this is (the trial's `integration`).
        failed: the integration turned itself off after an error of its own.
    """

    def __init__(self, integration: Integration) -> None:
        self.integration = integration
        self.failed = False
        self._context: Context | None = None
        self._opened: AbstractContextManager[Context] | None = None
        self._planned: tuple[str, int] | None = None

    @property
    def context(self) -> Context | None:
        """The harness context, once `start` opened or joined one (None after a failure)."""
        return None if self.failed else self._context

    def start(self) -> Context | None:
        """Join the script's open `init()` block, else open one until `close` (or exit)."""
        if self._context is not None or self.failed:
            return self.context
        with self.guard("connecting to muster"):
            joined = harness_context.active()
            if joined is not None:
                self._context = joined
                return joined
            opened = harness_context.init(integration=self.integration)
            self._context = opened.__enter__()
            self._opened = opened
            atexit.register(self.close)  # a script that never reaches the framework's end
        return self.context

    def close(self) -> None:
        """End the `init()` block this session opened (never the script's own)."""
        opened, self._opened = self._opened, None
        if opened is not None:
            with self.guard("closing muster's harness"):
                opened.__exit__(None, None, None)

    @contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Run muster's part of a hook; an error of its own turns the integration off."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the rule: never break the script
            self.fail(doing, exc)

    def fail(self, doing: str, exc: BaseException) -> None:
        """Say once, on stderr (the trial's log), that the integration is off, and why."""
        if not self.failed:
            print(f"muster: the {self.integration} integration is off for the rest of this "
                  f"run: {doing} failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
        self.failed = True

    def plan(self, unit: str, length: int) -> None:
        """Declare the run's planned length once (again only when it changes)."""
        ctx = self.context
        if ctx is None or self._planned == (unit, length) or length < 1:
            return
        with self.guard("declaring the planned length"):
            ctx.plan(**{unit: length})
            self._planned = (unit, length)

    def report(self, validation: bool, step: int, metrics: Mapping[str, object]) -> None:
        """Report the framework's metrics that are numbers, under names muster accepts."""
        ctx = self.context
        if ctx is None:
            return
        values = reportable(metrics)
        if not values:
            return
        with self.guard("reporting metrics"):
            if validation:
                ctx.report_validation(step, values)
            else:
                ctx.report_training(step, values)

    def should_stop(self) -> bool:
        """True once muster asked the run to stop (pause, kill, the searcher)."""
        ctx = self.context
        return ctx is not None and ctx.should_stop()

    def latest(self) -> Checkpoint | None:
        """The checkpoint to resume from: muster's latest intact one (the experiment's warm
        start while the trial has none of its own), or None."""
        ctx = self.context
        if ctx is None:
            return None
        with self.guard("finding the checkpoint to resume from"):
            return ctx.checkpoint.restore()
        return None

    def resumable(self, key: str, part: str) -> Resumable | None:
        """What the framework resumes from: the latest checkpoint's `metadata[key][part]`,
        a path inside it that exists, with `metadata[key]` (its framework's facts); None
        where there is no checkpoint, or it holds no such part (the framework starts over).
        Opens the harness first: a framework asks before its training starts."""
        self.start()
        found = self.latest()
        facts = found.metadata.get(key) if found is not None else None
        name = facts.get(part) if isinstance(facts, Mapping) else None
        if found is None or not isinstance(facts, Mapping) or not isinstance(name, str) \
                or not (found.path / name).exists():
            return None
        return Resumable(found, found.path / name, facts)

    @contextmanager
    def saving(self, step: int, metadata: Mapping[str, Any]) -> Iterator[Path | None]:
        """A directory to write a checkpoint into, published as muster's when the block
        ends; None (write where the framework asked) when muster cannot take it: the save
        still happens, and a failure to publish is said and recorded, not raised."""
        ctx = self.context
        if ctx is None:
            yield None
            return
        try:
            saving = ctx.checkpoint.save(step, metadata)
            directory = saving.__enter__()
        except (CheckpointError, OSError, TypeError, ValueError) as exc:
            print(f"muster: the checkpoint for step {step} is not muster's: {exc}",
                  file=sys.stderr, flush=True)
            yield None
            return
        try:
            yield directory
        except BaseException:
            # The framework's own error is what the script sees; the harness removes the
            # half-written directory and records the failed save.
            with contextlib.suppress(CheckpointError):
                saving.__exit__(*sys.exc_info())
            raise
        else:
            with contextlib.suppress(CheckpointError):  # said by the harness (save-failures)
                saving.__exit__(None, None, None)

    def published(self) -> Path | None:
        """The checkpoint this process published last."""
        ctx = self.context
        return None if ctx is None else ctx.checkpoint.last_saved


def reportable(metrics: Mapping[str, object]) -> dict[str, float | int]:
    """The entries of `metrics` muster can chart: numbers (0-d tensors and NumPy scalars
    too) under names that follow `muster.metrics_lines.NAME_RULE` (other characters become
    `_`); strings, lists and booleans are left out."""
    values: dict[str, float | int] = {}
    for name, value in metrics.items():
        number = _number(value)
        clean = _name(name) if number is not None else None
        if clean is not None and number is not None:
            values[clean] = number
    return values


def _number(value: object) -> float | int | None:
    if type(value) is float or type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(value, "item"):
        return None
    numel = getattr(value, "numel", None)
    size = numel() if callable(numel) else getattr(value, "size", 1)
    if size != 1:
        return None
    item = value.item()
    if isinstance(item, bool) or not isinstance(item, int | float):
        return None
    return item


def _name(name: object) -> str | None:
    if not isinstance(name, str):
        return None
    known = _NAMES.get(name, "")
    if known != "":
        return known
    clean: str | None = _BAD_CHARACTERS.sub("_", name)[:128]
    if clean is not None and name_problem(clean) is not None:
        clean = None
    if len(_NAMES) < _NAMES_KEPT:
        _NAMES[name] = clean
    return clean
