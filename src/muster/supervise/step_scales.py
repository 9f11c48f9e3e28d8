"""One warning per trial whose validation and checkpoint steps count in different units.

A script that reports validation at the epoch (1, 2, ...) and saves checkpoints at the
optimizer step (45, 90, ...) is not wrong, and each checkpoint still gets the validation it
was saved after (`checkpoint_storage.metrics`); but its steps no longer compare, so a reader of
"checkpoint 90, val_accuracy 0.98 at step 2" deserves to be told once. The sign is a pair of
one attempt that only different units explain (`step_scale_conflict`). Checked after an
ingestion that stored a rank-0 validation or registered a checkpoint, until the trial has
the warning; the supervisor is the only caller, so two checks never race.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.checkpoint_storage.metrics import Mark, step_scale_conflict
from muster.states import EventReason, MetricKind, MetricSource
from muster.store import Checkpoint, Event, Metric, Store, Trial, record_event
from muster.store.actors import SUPERVISOR

__all__ = ["warn_if_step_scales_differ"]


def warn_if_step_scales_differ(store: Store, trial_id: int, new_validations: Sequence[Mark],
                               new_checkpoints: bool) -> bool:
    """Record the trial's warning (an event) when its validation and checkpoint steps are
    seen to differ in unit, unless it has it already. Returns whether it was recorded.

    Args:
        new_validations: the rank-0 validation reports this ingestion stored; with
            `new_checkpoints`, every one of the trial's is read instead.
        new_checkpoints: this ingestion registered a checkpoint.
    """
    if not new_validations and not new_checkpoints:
        return False
    with store.session_scope() as s:
        if _warned(s, trial_id):
            return False
        saves = [Mark(attempt, time, step) for attempt, time, step in s.execute(
            select(Checkpoint.attempt, Checkpoint.created_at, Checkpoint.step)
            .where(Checkpoint.trial_id == trial_id))]
        if not saves:
            return False
        validations = _validations(s, trial_id) if new_checkpoints else list(new_validations)
        conflict = step_scale_conflict(saves, validations)
        if conflict is None:
            return False
        experiment_id = s.get_one(Trial, trial_id).experiment_id
        record_event(s, entity="trial", entity_id=trial_id, trial_id=trial_id,
                     experiment_id=experiment_id, reason=EventReason.STEP_SCALES_DIFFER,
                     actor=SUPERVISOR, message=_message(conflict.describe()))
    return True


def _warned(s: Session, trial_id: int) -> bool:
    return s.scalar(select(Event.id).where(
        Event.trial_id == trial_id,
        Event.reason == EventReason.STEP_SCALES_DIFFER).limit(1)) is not None


def _validations(s: Session, trial_id: int) -> list[Mark]:
    return [Mark(attempt, time, step) for attempt, time, step in s.execute(
        select(Metric.attempt, Metric.time, Metric.step)
        .where(Metric.trial_id == trial_id, Metric.kind == MetricKind.VALIDATION, Metric.rank == 0,
               Metric.source == MetricSource.HARNESS)
        .order_by(Metric.id))]


def _message(conflict: str) -> str:
    return (f"validation and checkpoint steps use different scales: {conflict}. Each "
            "checkpoint's metric is the validation reported before it was saved (its "
            "'validated at' step), not one with the same step number; report validation "
            "and save checkpoints in one unit (e.g. both at the epoch) for their steps to "
            "compare")
