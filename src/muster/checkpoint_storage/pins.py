"""What holds a checkpoint against garbage collection and deletion, and why.

Three things do: a model version that registered it (for as long as the version exists), a
trial that has not ended and starts from it (a PBT member, from its parent's checkpoint:
`Trial.source_checkpoint_id`), and an experiment that warm-starts from it
(`Experiment.source_checkpoint_id`, `muster.services.warm_starts`) while that experiment,
or one of its trials, has not ended: a trial it has yet to start, or one that has to start
over before it saved a checkpoint of its own, copies it then. GC keeps every checkpoint
held (`held`, in the plan and again as the plan is recorded), and `experiment delete`
refuses an experiment whose checkpoints something holds (`warm_starts_from`; the registry's check is
`muster.services.retention.registered_versions`). The cluster config's `retention` keeps
the run of a trial whose checkpoint something holds (`muster.checkpoint_storage.retention`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, exists, or_, select
from sqlalchemy.orm import Session, aliased

from muster.states import ExperimentState, TrialState, values
from muster.store import Checkpoint, Experiment, ModelVersion, RegisteredModel, Trial

__all__ = ["held", "warm_starts_from"]


def held(s: Session, checkpoint_ids: Sequence[int], registered: bool = True
         ) -> dict[int, str]:
    """Which of these checkpoints something holds: id -> why ("registered as NAME vN: the
    registry holds it", "experiment 7 starts its trials from it and has not ended").
    Without `registered`, only warm starts hold (retention's `keep_registered: false`)."""
    reasons: dict[int, list[str]] = {}
    holders = (_registered(s, checkpoint_ids) if registered else {},
               _warm_starts(s, checkpoint_ids), _parents(s, checkpoint_ids))
    for found in holders:
        for checkpoint_id, why in found.items():
            reasons.setdefault(checkpoint_id, []).append(why)
    return {checkpoint_id: "; ".join(why) for checkpoint_id, why in reasons.items()}


def warm_starts_from(s: Session, experiment_id: int) -> list[str]:
    """The experiments that have not ended and start their trials from a checkpoint of
    experiment `experiment_id`: "experiment 9 (from step-…, trial 3)", by id."""
    rows = s.execute(select(Experiment.id, Checkpoint.name, Checkpoint.trial_id)
                     .join(Checkpoint, Checkpoint.id == Experiment.source_checkpoint_id)
                     .join(Trial, Trial.id == Checkpoint.trial_id)
                     .where(Trial.experiment_id == experiment_id, _running())
                     .order_by(Experiment.id))
    return [f"experiment {holder} (from {name}, trial {trial_id})"
            for holder, name, trial_id in rows]


def _registered(s: Session, checkpoint_ids: Sequence[int]) -> dict[int, str]:
    """Which of these checkpoints model versions hold: id -> "registered as NAME vN, ..."."""
    found: dict[int, list[str]] = {}
    for checkpoint_id, name, version in s.execute(
            select(ModelVersion.checkpoint_id, RegisteredModel.name, ModelVersion.version)
            .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
            .where(ModelVersion.checkpoint_id.in_(checkpoint_ids))
            .order_by(RegisteredModel.name, ModelVersion.version)):
        found.setdefault(checkpoint_id, []).append(f"{name} v{version}")
    return {cid: "registered as " + ", ".join(names) + ": the registry holds it"
            for cid, names in found.items()}


def _warm_starts(s: Session, checkpoint_ids: Sequence[int]) -> dict[int, str]:
    """Which of these checkpoints experiments that have not ended start from."""
    found: dict[int, list[str]] = {}
    for checkpoint_id, holder in s.execute(
            select(Experiment.source_checkpoint_id, Experiment.id)
            .where(Experiment.source_checkpoint_id.in_(checkpoint_ids), _running())
            .order_by(Experiment.id)):
        if checkpoint_id is not None:  # (always: the query asks for these ids)
            found.setdefault(checkpoint_id, []).append(str(holder))
    return {cid: (f"experiment {holders[0]} starts its trials from it and has not ended"
                  if len(holders) == 1 else f"experiments {', '.join(holders)} start their "
                                            "trials from it and have not ended")
            for cid, holders in found.items()}


def _parents(s: Session, checkpoint_ids: Sequence[int]) -> dict[int, str]:
    """Which of these checkpoints unfinished trials start from (a PBT member's parent's,
    `Trial.source_checkpoint_id`): it is copied in at each launch until the trial has saved
    a checkpoint of its own."""
    found: dict[int, list[str]] = {}
    for checkpoint_id, holder in s.execute(
            select(Trial.source_checkpoint_id, Trial.id)
            .where(Trial.source_checkpoint_id.in_(checkpoint_ids),
                   Trial.state.in_(values(TrialState.unfinished())))
            .order_by(Trial.id)):
        if checkpoint_id is not None:  # (always: the query asks for these ids)
            found.setdefault(checkpoint_id, []).append(str(holder))
    return {cid: (f"trial {holders[0]} starts from it and has not ended" if len(holders) == 1
                  else f"trials {', '.join(holders)} start from it and have not ended")
            for cid, holders in found.items()}


def _running() -> ColumnElement[bool]:
    """An experiment that has not ended, or one of whose trials has not."""
    its = aliased(Trial)  # (a query may join the source's own trial)
    unfinished = exists().where(its.experiment_id == Experiment.id,
                                its.state.in_(values(TrialState.unfinished())))
    ended = values(state for state in ExperimentState if state.is_terminal())
    return or_(Experiment.state.not_in(ended), unfinished)
