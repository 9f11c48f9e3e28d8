"""`core_context.train`: Determined's metric reports, as the harness's metrics of the rank.

Training and validation reports are muster's two series (`ctx.report_training`,
`ctx.report_validation`), at `steps_completed`; a report in another group goes into the
training series with the group before each name (`report_metrics("inference", 10,
{"latency": 3.5})` records `inference/latency` at step 10). Values are numbers (0-d tensors
too); another value is refused with a message naming the metric.
"""

from __future__ import annotations

import pathlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from muster.states import MetricKind

from .._unprovided import unprovided

if TYPE_CHECKING:
    from muster.harness.context import Context as HarnessContext

_NO_SERVER = "a muster trial does not query muster's server"


class TensorboardMode(str, Enum):
    """Determined writes (`AUTO`) or leaves to the script (`MANUAL`) TensorBoard files;
    muster collects none either way."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


class EarlyExitReason(str, Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class TrainContext:
    """Reports of this rank's metrics and progress."""

    def __init__(self, harness: HarnessContext, tensorboard_mode: TensorboardMode) -> None:
        self._harness = harness
        self._tensorboard_mode = TensorboardMode(tensorboard_mode)
        self._warned_tensorboard = False

    def report_training_metrics(self, steps_completed: int, metrics: Mapping[str, Any],
                                batch_metrics: Sequence[Mapping[str, Any]] | None = None
                                ) -> None:
        """Record training metrics at `steps_completed`.

        Raises:
            NotImplementedError: `batch_metrics` holds per-batch reports (report each batch
                at its own step instead).
            TypeError, ValueError: a step or metric the harness refuses; the message names it.
        """
        if batch_metrics:
            raise unprovided("report_training_metrics(batch_metrics=...)", "muster records "
                             "one report per step; report each batch at its own step")
        self._harness.report_training(steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int,
                                  metrics: Mapping[str, Any]) -> None:
        """Record validation metrics at `steps_completed` (muster's searcher reads its
        `searcher.metric` from these)."""
        self._harness.report_validation(steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int,
                       metrics: Mapping[str, Any]) -> None:
        """Record metrics of `group`: "training", "validation", or another group's, which
        go into the training series as `<group>/<name>` (and count as progress as training
        reports do)."""
        if group == MetricKind.TRAINING:
            self._harness.report_training(steps_completed, metrics)
        elif group == MetricKind.VALIDATION:
            self._harness.report_validation(steps_completed, metrics)
        else:
            named = {f"{group}/{name}": value for name, value in metrics.items()}
            self._harness.report_training(steps_completed, named)

    def report_progress(self, progress: float) -> None:
        """Count as progress (a heartbeat). muster measures how far a trial is from the
        steps it reports against its planned length, so the fraction itself is not kept.

        Raises:
            ValueError: `progress` is outside [0, 1].
        """
        if not 0 <= progress <= 1:
            raise ValueError(f"progress must be between 0 and 1, got {progress}")
        self._harness.heartbeat()

    def set_status(self, status: str) -> None:
        """Write `status` as a line of the trial's log (muster shows no status field)."""
        print(f"determined: status: {status}", flush=True)

    def upload_tensorboard_files(
        self, selector: Callable[[pathlib.Path], bool] = lambda _: True,
        mangler: Callable[[pathlib.Path, int], pathlib.Path] = lambda p, __: p,
    ) -> None:
        """Nothing is uploaded: muster collects no TensorBoard files (the files stay where
        the script wrote them); a warning says so once.

        Raises:
            RuntimeError: `tensorboard_mode` is AUTO, where Determined refuses this call too.
        """
        if self._tensorboard_mode is TensorboardMode.AUTO:
            raise RuntimeError("upload_tensorboard_files() needs "
                               "core.init(tensorboard_mode=TensorboardMode.MANUAL)")
        if not self._warned_tensorboard:
            self._warned_tensorboard = True
            warnings.warn("muster collects no TensorBoard files: upload_tensorboard_files() "
                          "uploads nothing; they stay where the script wrote them",
                          RuntimeWarning, stacklevel=2)

    def get_tensorboard_path(self) -> pathlib.Path:
        raise unprovided("TrainContext.get_tensorboard_path", "muster collects no "
                         "TensorBoard files; write them where you choose")

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        raise unprovided("TrainContext.report_early_exit", "muster has no early-exit "
                         "record: return from the script to end the trial, or raise to fail it")

    def get_experiment_best_validation(self) -> float | None:
        raise unprovided("TrainContext.get_experiment_best_validation", _NO_SERVER)

    def set_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any] | None:
        raise unprovided("TrainContext.set_metadata", "muster keeps no run metadata beside "
                         "hyperparameters, metrics and checkpoints")

    def get_metadata(self) -> dict[str, Any] | None:
        raise unprovided("TrainContext.get_metadata", "muster keeps no run metadata beside "
                         "hyperparameters, metrics and checkpoints")
