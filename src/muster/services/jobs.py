"""The queue and what runs (`muster job list`), and trial priorities (`muster job set-priority`).

A job is a trial that runs or waits: QUEUED, STARTING, RUNNING, RESTARTING or PAUSED. The
supervisor's next pass puts a changed priority into effect (queue order, `queue_reason`
positions, and with preemption on, who may be stopped for whom).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import case, select
from sqlalchemy.orm import Session, selectinload

from muster import api
from muster.config.schema import ResourcesConfig
from muster.errors import Conflict, InvalidRequest
from muster.priority import MAX_PRIORITY, MIN_PRIORITY
from muster.services import progress
from muster.services.access import Action, Principal, check_priority_floor
from muster.services.experiments import (
    authorize_on,
    describe_trial,
    experiment_or_404,
    experiment_view,
    trial_or_404,
)
from muster.services.listing import Page, check_window, window
from muster.states import EventReason, GpuState, TrialState, values
from muster.store import Experiment, GpuDevice, Store, Trial, record_event
from muster.store.configs import experiment_resources

__all__ = ["MAX_PAGE", "check_priority", "job_order", "list_jobs",
           "set_experiment_priority", "set_trial_priority"]

MAX_PAGE = 1000  # jobs in one page: the default and the most
T = TrialState
# Listed in three groups: what holds resources, then the queue, then paused trials.
_GROUP = {T.STARTING: 0, T.RUNNING: 0, T.RESTARTING: 0, T.QUEUED: 1, T.PAUSED: 2}
# `job_order` in SQL.
_JOB_ORDER = (case({state.value: group for state, group in _GROUP.items()}, value=Trial.state),
              Trial.priority, Trial.id)


def job_order(state: TrialState, priority: int, trial_id: int) -> tuple[int, int, int]:
    """Where a job is listed: trials holding resources, then the queue in the scheduler's
    order, then paused trials; within each group by priority (lower first), then id."""
    return _GROUP[state], priority, trial_id


def list_jobs(store: Store, offset: int = 0, limit: int = MAX_PAGE) -> Page[api.Job]:
    """A page of the jobs in `job_order`, `limit` (at most `MAX_PAGE`, the default) from
    `offset`: each with what it needs, the GPUs it holds and, RUNNING, its `progress` (the
    running trials are as many as the slots: each is measured cheaply).

    Raises:
        InvalidRequest: a negative `offset`, or a `limit` not 1 to `MAX_PAGE`.
    """
    check_window(offset, limit, MAX_PAGE)
    with store.session_scope() as s:
        query = (select(Trial).where(Trial.state.in_(values(TrialState.unfinished())))
                 .options(selectinload(Trial.experiment).selectinload(Experiment.owner))
                 .order_by(*_JOB_ORDER))
        trials, total = window(s, query, offset, limit)
        held = _held_gpus(s)
        resources: dict[int, ResourcesConfig] = {}
        measured = progress.of_running(s, trials)
        jobs = []
        for trial in trials:
            exp = trial.experiment
            if exp.id not in resources:
                resources[exp.id] = experiment_resources(exp.uuid, exp.config)
            jobs.append(_job_view(trial, resources[exp.id], held.get(trial.id, []),
                                  measured.get(trial.id)))
        return Page(jobs, total, offset, limit)


def _held_gpus(s: Session) -> dict[int, list[int]]:
    held: dict[int, list[int]] = defaultdict(list)
    for index, trial_id in s.execute(select(GpuDevice.index, GpuDevice.trial_id).where(
            GpuDevice.state == GpuState.ALLOCATED).order_by(GpuDevice.index)):
        if trial_id is not None:
            held[trial_id].append(index)
    return held


def _job_view(trial: Trial, resources: ResourcesConfig, gpus: list[int],
              measured: api.TrialProgress | None) -> api.Job:
    return {
        "trial_id": trial.id,
        "experiment_id": trial.experiment_id,
        "experiment_name": trial.experiment.name,
        "owner": trial.experiment.owner_name,
        "state": trial.state,
        "priority": trial.priority,
        "replicas": resources.replicas,
        "gpus_per_replica": resources.gpus_per_replica,
        "gpu_type": resources.gpu_type,
        "gpus": gpus,
        "queue_reason": trial.queue_reason,
        "progress": measured,
    }


def check_priority(priority: int) -> None:
    """Raises InvalidRequest unless `priority` is a valid place in the queue."""
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidRequest(f"priority must be {MIN_PRIORITY} to {MAX_PRIORITY} (lower runs "
                             f"first), but got {priority}")


def set_trial_priority(store: Store, principal: Principal, trial_id: int, priority: int,
                       floor: int = MIN_PRIORITY) -> api.TrialDescription:
    """Give one trial a new priority; returns the trial as `describe_trial`. A non-admin
    may give no priority better than `floor`.

    Raises:
        InvalidRequest: `priority` is not 1 to 99.
        Forbidden: not the caller's trial, or a priority reserved for admins.
        NotFound: there is no such trial.
        Conflict: the trial has ended (or is SUSPECT): it will not run again.
    """
    check_priority(priority)
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        authorize_on(principal, Action.SET_PRIORITY, trial.experiment, f"trial {trial_id}")
        check_priority_floor(principal, priority, floor)
        s.refresh(trial, with_for_update=True)
        if trial.state.is_at_rest():
            raise Conflict(f"trial {trial_id} is {trial.state}: it will not run again, so its "
                           "priority no longer matters")
        _change_priority(s, trial, priority, principal.name)
    return describe_trial(store, trial_id)


def set_experiment_priority(store: Store, principal: Principal, experiment_id: int,
                            priority: int, floor: int = MIN_PRIORITY) -> api.ExperimentDetail:
    """Give an experiment's trials that have not ended, and the trials it makes from now
    on, a new priority; returns the experiment as `describe_experiment`. A non-admin may
    give no priority better than `floor`.

    Raises:
        InvalidRequest: `priority` is not 1 to 99.
        Forbidden: not the caller's experiment, or a priority reserved for admins.
        NotFound: there is no such experiment.
        Conflict: the experiment has ended.
    """
    check_priority(priority)
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        authorize_on(principal, Action.SET_PRIORITY, exp)
        check_priority_floor(principal, priority, floor)
        s.refresh(exp, with_for_update=True)
        if exp.state.is_terminal():
            raise Conflict(f"experiment {experiment_id} is {exp.state}: its trials will not "
                           "run again, so its priority no longer matters")
        if exp.priority != priority:
            record_event(s, entity="experiment", entity_id=exp.id,
                         reason=EventReason.PRIORITY_CHANGED, actor=principal.name,
                         message=f"priority {exp.priority} → {priority}",
                         experiment_id=exp.id)
            exp.priority = priority
        for trial in exp.trials:
            if not trial.state.is_at_rest():
                _change_priority(s, trial, priority, principal.name)
        return experiment_view(s, exp)


def _change_priority(s: Session, trial: Trial, priority: int, actor: str) -> None:
    if trial.priority == priority:
        return  # setting the same priority twice records nothing
    record_event(s, entity="trial", entity_id=trial.id,
                 reason=EventReason.PRIORITY_CHANGED, actor=actor,
                 message=f"priority {trial.priority} → {priority}",
                 experiment_id=trial.experiment_id, trial_id=trial.id)
    trial.priority = priority
