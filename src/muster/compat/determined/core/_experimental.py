"""`core_context.experimental`: Determined's record, kept by its master, of the checkpoints
and model versions a task used; muster keeps no such record."""

from __future__ import annotations

from typing import Any

from .._unprovided import unprovided


class ExperimentalCoreContext:
    def report_task_using_checkpoint(self, checkpoint: Any) -> None:
        raise unprovided("ExperimentalCoreContext.report_task_using_checkpoint",
                         "muster keeps no record of which task used which checkpoint")

    def report_task_using_model_version(self, model_version: Any) -> None:
        raise unprovided("ExperimentalCoreContext.report_task_using_model_version",
                         "muster has no model registry")
