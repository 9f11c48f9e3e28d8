"""Which checkpoints an experiment keeps: Determined's `save_*` policy, plus muster's safety.

A checkpoint is kept while it is among its trial's latest `save_trial_latest`, its trial's
best `save_trial_best`, or the experiment's best `save_experiment_best` (the union); every
other one is deleted. On top of that, the latest intact checkpoint of a trial that may still
run is never deleted, whatever the counts: it is what a restart resumes from; and while
that one is not stored yet, neither is the trial's latest stored one (the only copy off
the trial's machine).

`plan` is pure: the worker reads the facts once, asks for a plan and carries it out.

Which checkpoints count toward the policy: the intact ones that are not being deleted
(LOCAL, UPLOADING, STORED, UPLOAD_FAILED). An UPLOADING one counts (it can be the latest and
push an older one out) but is itself kept until it is stored. A checkpoint that is not
intact counts for nothing and is kept as evidence.

Order and ties, so that a plan never depends on the order of its input:
- "later" is the greater `order` (step, saved_at, name), then the greater id;
- "better" is the better finite metric (NaN and infinities are no metric), then the smaller
  distance from its validation (`step - metric_step`; an unknown `metric_step` ranks after
  every known one), then the earlier `order`, then the smaller id.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields

from muster.states import CheckpointState

__all__ = [
    "BEING_UPLOADED",
    "DELETION_BEGUN",
    "NOT_INTACT",
    "CheckpointFacts",
    "Decision",
    "Policy",
    "plan",
]

DELETION_BEGUN = "deletion already begun"
NOT_INTACT = "not intact: kept as evidence of what went wrong"
BEING_UPLOADED = "being uploaded: decided once stored"


@dataclass(frozen=True)
class Policy:
    """How many checkpoints to keep (Determined's `checkpoint_storage.save_*`)."""

    save_trial_latest: int = 1
    save_trial_best: int = 1
    save_experiment_best: int = 0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"{field.name} must be a whole number >= 0, but got {field.name}={value!r}."
                )


@dataclass(frozen=True)
class CheckpointFacts:
    """What the planner needs to know of one checkpoint."""

    id: int
    trial_id: int
    order: tuple[int, float, str]  # (step, saved_at, name): a greater order is a later one
    intact: bool
    state: CheckpointState
    # The searcher metric of the validation it was saved after (`checkpoint_storage.metrics`);
    # None: no validation before it in its attempt.
    metric: float | None = None
    metric_step: int | None = None  # the step of that validation


@dataclass(frozen=True)
class Decision:
    checkpoint_id: int
    keep: bool
    reasons: tuple[str, ...]  # why kept (every reason that applies), or the one why deleted


@dataclass(frozen=True)
class _Selection:
    """The ids each rule keeps, among the checkpoints that count."""

    trial_latest: frozenset[int]
    trial_best: frozenset[int]
    experiment_best: frozenset[int]
    protected: frozenset[int]
    stored_fallback: frozenset[int]  # a live trial's latest stored, its latest not yet stored


def plan(
    checkpoints: Sequence[CheckpointFacts],
    may_still_run: Collection[int],
    policy: Policy,
    smaller_is_better: bool,
) -> list[Decision]:
    """Keep or delete each checkpoint of one experiment; DELETED ones are left out.

    Args:
        checkpoints: every checkpoint of the experiment, in any order.
        may_still_run: ids of the trials that are not terminal (their latest intact
            checkpoint is never deleted).
        policy: the experiment's counts.
        smaller_is_better: the searcher metric's direction.

    Returns:
        One decision per checkpoint that is not DELETED, by (trial id, order).
    """
    live = sorted((c for c in checkpoints if not c.state.is_terminal()), key=_position)
    counted = [c for c in live if _counts(c)]
    selection = _select(counted, may_still_run, policy, smaller_is_better)
    return [_decide(c, selection, policy) for c in live]


def _position(c: CheckpointFacts) -> tuple[int, tuple[int, float, str], int]:
    return (c.trial_id, c.order, c.id)


def _later(c: CheckpointFacts) -> tuple[tuple[int, float, str], int]:
    return (c.order, c.id)


def _counts(c: CheckpointFacts) -> bool:
    return c.intact and c.state is not CheckpointState.DELETING


def _finite_metric(c: CheckpointFacts) -> float | None:
    return c.metric if c.metric is not None and math.isfinite(c.metric) else None


def _better(
    c: CheckpointFacts, metric: float, smaller_is_better: bool
) -> tuple[float, bool, int, tuple[int, float, str], int]:
    """A sort key, the best checkpoint first; `metric` is its finite metric."""
    value = metric if smaller_is_better else -metric
    if c.metric_step is None:
        return (value, True, 0, c.order, c.id)
    return (value, False, c.order[0] - c.metric_step, c.order, c.id)


def _latest(group: Iterable[CheckpointFacts], n: int) -> list[CheckpointFacts]:
    return sorted(group, key=_later, reverse=True)[:n]


def _best(
    group: Iterable[CheckpointFacts], n: int, smaller_is_better: bool
) -> list[CheckpointFacts]:
    scored = [(c, m) for c in group if (m := _finite_metric(c)) is not None]
    scored.sort(key=lambda cm: _better(cm[0], cm[1], smaller_is_better))
    return [c for c, _ in scored[:n]]


def _ids(chosen: Iterable[CheckpointFacts]) -> frozenset[int]:
    return frozenset(c.id for c in chosen)


def _select(
    counted: Sequence[CheckpointFacts],
    may_still_run: Collection[int],
    policy: Policy,
    smaller_is_better: bool,
) -> _Selection:
    by_trial: dict[int, list[CheckpointFacts]] = defaultdict(list)
    for c in counted:
        by_trial[c.trial_id].append(c)
    trials = by_trial.items()
    return _Selection(
        trial_latest=_ids(c for _, g in trials for c in _latest(g, policy.save_trial_latest)),
        trial_best=_ids(
            c for _, g in trials for c in _best(g, policy.save_trial_best, smaller_is_better)
        ),
        experiment_best=_ids(_best(counted, policy.save_experiment_best, smaller_is_better)),
        protected=_ids(c for t, g in trials if t in may_still_run for c in _latest(g, 1)),
        stored_fallback=_ids(c for t, g in trials if t in may_still_run
                             for c in _stored_fallback(g)),
    )


def _stored_fallback(group: Sequence[CheckpointFacts]) -> list[CheckpointFacts]:
    """While a live trial's latest checkpoint is only on its machine (not yet stored), its
    latest stored one stays too: losing that disk must not lose every resume point."""
    latest = _latest(group, 1)
    if not latest or latest[0].state is CheckpointState.STORED:
        return []
    return _latest((c for c in group if c.state is CheckpointState.STORED), 1)


def _decide(c: CheckpointFacts, selection: _Selection, policy: Policy) -> Decision:
    if c.state is CheckpointState.DELETING:
        return Decision(c.id, keep=False, reasons=(DELETION_BEGUN,))
    if not c.intact:
        return Decision(c.id, keep=True, reasons=(NOT_INTACT,))
    reasons = _kept_because(c, selection, policy)
    if c.state is CheckpointState.UPLOADING:
        return Decision(c.id, keep=True, reasons=(BEING_UPLOADED, *reasons))
    if reasons:
        return Decision(c.id, keep=True, reasons=reasons)
    return Decision(c.id, keep=False, reasons=(_outside(c, policy),))


def _kept_because(c: CheckpointFacts, selection: _Selection, policy: Policy) -> tuple[str, ...]:
    t = c.trial_id
    reasons: list[str] = []
    if c.id in selection.trial_latest:
        reasons.append(f"among trial {t}'s latest {policy.save_trial_latest}")
    if c.id in selection.trial_best:
        reasons.append(f"among trial {t}'s best {policy.save_trial_best} ({_metric_words(c)})")
    if c.id in selection.experiment_best:
        reasons.append(
            f"among the experiment's best {policy.save_experiment_best} ({_metric_words(c)})"
        )
    if c.id in selection.protected:
        reasons.append(f"the latest intact checkpoint of trial {t}, which may still run")
    if c.id in selection.stored_fallback:
        reasons.append(f"the latest stored checkpoint of trial {t}, which may still run, "
                       "kept until a later one is stored")
    return tuple(reasons)


def _metric_words(c: CheckpointFacts) -> str:
    if c.metric_step is None:
        return f"metric {c.metric:g}"
    return f"metric {c.metric:g} at step {c.metric_step}"


def _outside(c: CheckpointFacts, policy: Policy) -> str:
    return (
        f"not among trial {c.trial_id}'s latest {policy.save_trial_latest}"
        f" or best {policy.save_trial_best},"
        f" nor the experiment's best {policy.save_experiment_best}"
    )
