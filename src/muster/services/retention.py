"""Checkpoints listed, garbage-collected on demand, experiments archived and deleted, and
the cluster config's retention planned or applied (`muster gc runs`).

What routes and the CLI call; the storage worker (`muster.checkpoint_storage.worker`) does the
deleting, in its own thread, from what these record. A retention sweep asked for here is
planned here (a read, with sizes) and carried out there, so it never races the worker's
own collections; the worker re-plans from what exists, recording each removal first.
A server without `retention` (or with neither age) answers an empty plan that says so,
not an error: nothing is past a rule it does not have.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster import api
from muster.checkpoint_storage.location import effective_policy
from muster.checkpoint_storage.metrics import checkpoint_metrics
from muster.checkpoint_storage.pins import warm_starts_from
from muster.checkpoint_storage.retention import Kept, Line, logs_gone
from muster.checkpoint_storage.retention_sweep import Sweep
from muster.checkpoint_storage.worker import PlannedCheckpoint, StorageWorker
from muster.config.units import format_duration
from muster.errors import Conflict, NotFound
from muster.services import views
from muster.services.access import Action, Principal, authorize
from muster.services.experiments import experiment_or_404, trial_or_404
from muster.services.listing import Page, check_window, window
from muster.states import EventReason
from muster.store import (
    Checkpoint,
    ModelVersion,
    RegisteredModel,
    Store,
    Trial,
    record_event,
)
from muster.store.configs import experiment_config
from muster.store.models import now

__all__ = ["MAX_CHECKPOINTS", "checkpoint_row", "checkpoint_view", "collect",
           "delete_experiment", "experiment_checkpoints", "logs_removed", "set_archived",
           "sweep_runs", "trial_checkpoints"]

MAX_CHECKPOINTS = 1000  # checkpoints in one page of a list: the default and the most


def trial_checkpoints(store: Store, trial_id: int, offset: int = 0,
                      limit: int = MAX_CHECKPOINTS) -> Page[api.CheckpointView]:
    """A page of the trial's checkpoints by step, deleted ones included (with why): `limit`
    (at most `MAX_CHECKPOINTS`, the default) from `offset`.

    Raises:
        NotFound: no such trial.
        InvalidRequest: a negative `offset`, or a `limit` not 1 to `MAX_CHECKPOINTS`.
    """
    check_window(offset, limit, MAX_CHECKPOINTS)
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        rows, total = window(s, select(Checkpoint).where(Checkpoint.trial_id == trial_id)
                             .order_by(Checkpoint.step, Checkpoint.name),
                             offset, limit)
        metric = experiment_config(trial.experiment).searcher.metric
        return Page(_views(s, rows, metric), total, offset, limit)


def experiment_checkpoints(store: Store, experiment_id: int, offset: int = 0,
                           limit: int = MAX_CHECKPOINTS) -> Page[api.CheckpointView]:
    """A page of the checkpoints of the experiment's trials, by trial number and step:
    `limit` (at most `MAX_CHECKPOINTS`, the default) from `offset`.

    Raises:
        NotFound: no such experiment.
        InvalidRequest: a negative `offset`, or a `limit` not 1 to `MAX_CHECKPOINTS`.
    """
    check_window(offset, limit, MAX_CHECKPOINTS)
    with store.session_scope() as s:
        experiment = experiment_or_404(s, experiment_id)
        rows, total = window(s, select(Checkpoint).join(Trial, Trial.id == Checkpoint.trial_id)
                             .where(Trial.experiment_id == experiment_id)
                             .order_by(Trial.number, Trial.id, Checkpoint.step,
                                       Checkpoint.name),
                             offset, limit)
        metric = experiment_config(experiment).searcher.metric
        return Page(_views(s, rows, metric), total, offset, limit)


def checkpoint_view(store: Store, checkpoint: str) -> api.CheckpointView:
    """One checkpoint by id or uuid (`checkpoint_row`)."""
    with store.session_scope() as s:
        row = checkpoint_row(s, checkpoint)
        experiment = s.get_one(Trial, row.trial_id).experiment
        return _views(s, [row], experiment_config(experiment).searcher.metric)[0]


def _views(s: Session, rows: Sequence[Checkpoint], metric: str | None
           ) -> list[api.CheckpointView]:
    values = checkpoint_metrics(s, rows, metric)
    return [views.checkpoint_view(row, *values.get(row.id, (None, None))) for row in rows]


def collect(store: Store, worker: StorageWorker, who: Principal, experiment_id: int,
            counts: dict[str, int], dry_run: bool) -> api.GcPlan:
    """The experiment's GC plan (`counts` change its policy first, unless a dry run), each
    checkpoint with keep or delete and why; applied by the worker unless a dry run."""
    with store.session_scope() as s:
        experiment = experiment_or_404(s, experiment_id)
        if not dry_run:
            authorize(who, Action.COLLECT, owner=experiment.owner_name,
                      subject=f"experiment {experiment_id}")
        override = {**(experiment.gc_policy or {}), **counts}
        policy = effective_policy(experiment_config(experiment).checkpoint_storage,
                                  worker.default, override)
        if counts and not dry_run:
            experiment.gc_policy = override
            record_event(s, entity="experiment", entity_id=experiment_id,
                         reason=EventReason.GC_POLICY_CHANGED, actor=who.name,
                         experiment_id=experiment_id,
                         message=f"checkpoint GC policy now keeps each trial's latest "
                                 f"{policy.save_trial_latest} and best "
                                 f"{policy.save_trial_best}, and the experiment's best "
                                 f"{policy.save_experiment_best}")
    planned = worker.plan_for(experiment_id, override)
    if not dry_run:
        worker.request_gc(experiment_id)
    return {"experiment_id": experiment_id, "dry_run": dry_run,
            "policy": {"save_trial_latest": policy.save_trial_latest,
                       "save_trial_best": policy.save_trial_best,
                       "save_experiment_best": policy.save_experiment_best},
            "checkpoints": [_decision(p) for p in planned]}


def _decision(planned: PlannedCheckpoint) -> api.GcDecision:
    return {"id": planned.id, "trial_id": planned.trial_id, "name": planned.name,
            "step": planned.step, "state": planned.state,
            "keep": planned.keep, "reasons": list(planned.reasons)}


def delete_experiment(store: Store, worker: StorageWorker | None, who: Principal,
                      experiment_id: int) -> api.DeleteAccepted:
    """Mark an ended experiment for deletion; the worker removes its checkpoints (storage
    and local), run directories, logs and context, then its records.

    Raises:
        Conflict: the experiment has not ended (kill it first), or model versions hold
            checkpoints of its trials (named: delete those versions first), or experiments
            that have not ended warm-start from them (named).
    """
    with store.session_scope() as s:
        experiment = experiment_or_404(s, experiment_id)
        authorize(who, Action.DELETE, owner=experiment.owner_name,
                  subject=f"experiment {experiment_id}")
        if not experiment.state.is_terminal():
            raise Conflict(f"experiment {experiment_id} is {experiment.state}; only an ended "
                           f"experiment can be deleted: `muster experiment kill "
                           f"{experiment_id}` first")
        held = registered_versions(s, experiment_id)
        if held:
            raise Conflict(f"experiment {experiment_id} holds the checkpoints of "
                           f"{', '.join(held)}: the registry keeps them, so the experiment "
                           "stays; delete those model versions first")
        starting = warm_starts_from(s, experiment_id)
        if starting:
            raise Conflict(f"experiment {experiment_id} holds the checkpoints that "
                           f"{', '.join(starting)} start their trials from (a warm start), "
                           "so it stays until they have ended; delete it then, or kill them")
        if experiment.delete_requested_at is None:
            experiment.delete_requested_at = now()
            record_event(s, entity="experiment", entity_id=experiment_id,
                         reason=EventReason.DELETE_REQUESTED, actor=who.name,
                         experiment_id=experiment_id,
                         message=f"{who.name} asked to delete experiment {experiment_id} "
                                 f"({experiment.name}) with its files and checkpoints")
        name = experiment.name
    if worker is not None:
        worker.wake()
    return {"experiment_id": experiment_id, "deleting": True,
            "message": f"experiment {experiment_id} ({name}) is being deleted: its "
                       "checkpoints, run directories and logs first, then its records"}


def registered_versions(s: Session, experiment_id: int) -> list[str]:
    """The model versions ("NAME vN (trial T)") that hold checkpoints of the experiment."""
    rows = s.execute(select(RegisteredModel.name, ModelVersion.version, ModelVersion.trial_id)
                     .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
                     .where(ModelVersion.experiment_id == experiment_id)
                     .order_by(RegisteredModel.name, ModelVersion.version))
    return [f"{name} v{version} (trial {trial_id})" for name, version, trial_id in rows]


def set_archived(store: Store, who: Principal, experiment_id: int,
                 archived: bool) -> api.Archived:
    """Hide an experiment from the default lists (or show it again); nothing is removed."""
    with store.session_scope() as s:
        experiment = experiment_or_404(s, experiment_id)
        authorize(who, Action.ARCHIVE, owner=experiment.owner_name,
                  subject=f"experiment {experiment_id}")
        if experiment.archived != archived:
            experiment.archived = archived
            record_event(s, entity="experiment", entity_id=experiment_id,
                         reason=EventReason.ARCHIVED if archived else EventReason.UNARCHIVED,
                         actor=who.name, experiment_id=experiment_id, message=None)
        return {"experiment_id": experiment_id, "archived": archived}


def checkpoint_row(s: Session, checkpoint: str) -> Checkpoint:
    """A checkpoint by its id or its uuid.

    Raises:
        NotFound: no such checkpoint.
    """
    query = (select(Checkpoint).where(Checkpoint.id == int(checkpoint))
             if checkpoint.isdigit() and len(checkpoint) < 10
             else select(Checkpoint).where(Checkpoint.uuid == checkpoint))
    row = s.scalars(query).one_or_none()
    if row is None or s.get_one(Trial, row.trial_id).experiment.delete_requested_at is not None:
        raise NotFound(f"there is no checkpoint {checkpoint}; `muster checkpoint list "
                       "TRIAL_ID` shows a trial's")
    return row


RETENTION_OFF = ("retention is off: the cluster config has no `retention:` with logs_after or "
                 "runs_after (docs/how-to/team.md, \"Retention\"), so nothing is removed "
                 "but by `muster experiment delete`")


def sweep_runs(worker: StorageWorker, who: Principal, dry_run: bool) -> api.RetentionPlan:
    """What the cluster config's retention removes now, with sizes; unless `dry_run`, the
    storage worker carries it out at once (each trial's removal recorded as an event
    first, `who` named in it)."""
    config = worker.retention
    planned = worker.retention_plan()
    if config is None or planned is None:
        return {"enabled": False, "dry_run": dry_run, "rules": None, "lines": [],
                "total_bytes": 0, "complete": True, "kept": [], "more_kept": 0,
                "message": RETENTION_OFF}
    if not dry_run:
        worker.request_retention(who.name)
    return {"enabled": True, "dry_run": dry_run,
            "rules": {"logs_after": _duration(config.logs_after),
                      "runs_after": _duration(config.runs_after),
                      "keep_registered": config.keep_registered,
                      "keep_labels": list(config.keep_labels)},
            "lines": [_line(line) for line in planned.lines],
            "total_bytes": planned.total_bytes, "complete": planned.complete,
            "kept": [_kept(kept) for kept in planned.kept], "more_kept": planned.more_kept,
            "message": _sweep_message(planned, dry_run)}


def _duration(seconds: float | None) -> str | None:
    return None if seconds is None else format_duration(seconds)


def _line(line: Line) -> api.RetentionLine:
    return {"experiment_id": line.experiment_id, "experiment_name": line.experiment_name,
            "trial_id": line.trial_id, "what": line.what, "name": line.name,
            "bytes": line.bytes, "files": line.files, "at_least": line.at_least,
            "ended_at": line.ended_at, "rule": line.rule}


def _kept(kept: Kept) -> api.RetentionKept:
    return {"experiment_id": kept.experiment_id, "experiment_name": kept.experiment_name,
            "trial_id": kept.trial_id, "why": kept.why}


def _sweep_message(planned: Sweep, dry_run: bool) -> str:
    if not planned.total_lines:
        return "nothing is past the retention rules"
    if dry_run:
        return "a dry run: nothing was removed; `muster gc runs` removes these"
    return ("the storage worker removes these now, each trial's removal recorded as an "
            "event first (`muster events`)")


def logs_removed(store: Store, trial_id: int) -> str | None:
    """Why the trial's logs cannot be shown (retention removed them, alone or with its run),
    as its page says it; None while they are there."""
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        return logs_gone(trial.id, trial.logs_removed_at, trial.files_removed_at,
                         trial.experiment.ended_at)
