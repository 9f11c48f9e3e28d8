"""The searcher's metric of each checkpoint, for "best" in the GC policy and in listings.

A checkpoint's value is the rank-0 validation of the searcher's metric at its step, else
the nearest one before it (`planner.attribute_metrics`); a checkpoint before any
validation has none and is never anyone's best.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.metrics_lines import VALIDATION
from muster.storage.planner import attribute_metrics
from muster.store import Checkpoint, Metric

__all__ = ["checkpoint_metrics"]


def checkpoint_metrics(s: Session, rows: Sequence[Checkpoint], metric: str | None
                       ) -> dict[int, tuple[float, int]]:
    """Checkpoint id → (value, the step it was validated at), for those that have one."""
    if metric is None or not rows:
        return {}
    validations: dict[int, list[tuple[int, float]]] = defaultdict(list)
    trial_ids = sorted({row.trial_id for row in rows})
    for trial_id, step, values in s.execute(
            select(Metric.trial_id, Metric.step, Metric.values)
            .where(Metric.trial_id.in_(trial_ids), Metric.kind == VALIDATION, Metric.rank == 0)
            .order_by(Metric.id)):
        value = values.get(metric) if isinstance(values, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            validations[trial_id].append((step, float(value)))
    steps: dict[int, dict[int, int]] = defaultdict(dict)
    for row in rows:
        steps[row.trial_id][row.id] = row.step
    found: dict[int, tuple[float, int]] = {}
    for trial_id in trial_ids:
        found.update(attribute_metrics(steps[trial_id], validations[trial_id]))
    return found
