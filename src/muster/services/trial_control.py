"""A person's controls of one trial (`muster trial kill | pause | activate | restart`): what
the experiment's controls do, for one trial, while the rest of its search goes on.

- **kill**: the trial ends CANCELED: a queued or paused one at once, a running one once
  the supervisor has stopped it (SIGTERM, `stop_grace`, SIGKILL). Its searcher takes it
  as canceled, no result (`SearchOutcome.CANCELED`), and goes on drawing the others up to
  `max_trials`; an experiment whose every trial was killed ends CANCELED.
- **pause**: a queued trial is PAUSED at once; a running one is stopped as an
  experiment's pause stops it (SIGTERM and `stop_grace`, so `should_stop()` lets it
  checkpoint), frees its slots and GPUs and waits PAUSED, its experiment ACTIVE, until
  `trial activate` (or the experiment's pause and activate).
- **activate**: a PAUSED trial goes back to the queue and resumes from its latest
  checkpoint; one still being paused goes back as soon as it has stopped. Its experiment
  must be ACTIVE (a paused experiment's trials are activated with it).
- **restart**: a running trial is stopped as a pause stops it and goes back to the queue at
  once, resuming from its latest checkpoint: no failure, no budget used (a trial stuck on a
  slow node or a wedged GPU, a script fixed in the run's data). An ended trial never runs
  again; a new experiment can start from it (`searcher.source_trial_id`).

Each request is recorded as an event with its actor; asking again for what is under way is
harmless, and what cannot be done is a 409 that says what can.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from muster import api
from muster.errors import Conflict
from muster.services.access import Action, Principal
from muster.services.experiments import (
    authorize_on,
    describe_trial,
    stop_trial,
    trial_or_404,
)
from muster.states import EventReason, ExperimentState, StopIntent, TrialState
from muster.store import Store, Trial, record_event, transition

__all__ = ["activate_trial", "kill_trial", "pause_trial", "restart_trial"]


def kill_trial(store: Store, principal: Principal, trial_id: int) -> api.TrialDescription:
    """Stop one trial for good: CANCELED (at once when it has no process).

    Raises:
        NotFound, Forbidden: as for every trial action.
        Conflict: it has ended, or is SUSPECT (a review decides that one).
    """
    def kill(s: Session, trial: Trial) -> None:
        if trial.stop_requested:
            return
        _request(s, trial, principal, EventReason.KILL_REQUESTED,
                 "stopping this trial; the rest of its experiment goes on")
        stop_trial(s, trial, principal.name)

    return _control(store, principal, trial_id, Action.KILL, "killed", kill)


def pause_trial(store: Store, principal: Principal, trial_id: int) -> api.TrialDescription:
    """Pause one trial of an ACTIVE experiment until `activate_trial`.

    Raises:
        Conflict: it has ended or is SUSPECT; it is being killed or stopped early by the
            searcher; or its experiment is not ACTIVE.
    """
    def pause(s: Session, trial: Trial) -> None:
        if trial.state is TrialState.PAUSED or trial.stop_intent is StopIntent.PAUSE_TRIAL:
            return
        _check_stoppable(trial, "paused")
        _require_active(trial, "paused")
        if trial.state is TrialState.QUEUED:
            transition(s, trial, TrialState.PAUSED, reason=EventReason.PAUSED,
                       actor=principal.name, message=f"paused before it started; `muster "
                       f"trial activate {trial.id}` queues it again")
            return
        _request(s, trial, principal, EventReason.PAUSE_REQUESTED,
                 "pausing this trial: it stops (it can checkpoint first), frees its slots "
                 f"and waits PAUSED until `muster trial activate {trial.id}`")
        trial.stop_intent = StopIntent.PAUSE_TRIAL

    return _control(store, principal, trial_id, Action.PAUSE, "paused", pause)


def activate_trial(store: Store, principal: Principal, trial_id: int
                   ) -> api.TrialDescription:
    """Queue a PAUSED trial again (it resumes from its latest checkpoint); one still being
    paused is queued once it has stopped. A trial that is not paused is left as it is.

    Raises:
        Conflict: it has ended or is SUSPECT, or its experiment is not ACTIVE.
    """
    def activate(s: Session, trial: Trial) -> None:
        held = trial.stop_intent is StopIntent.PAUSE_TRIAL and not trial.stop_requested
        if trial.state is not TrialState.PAUSED and not held:
            return
        _require_active(trial, "activated")
        if held:  # still stopping: it goes PAUSED, and back to the queue, as an ACTIVE
            # experiment's paused trials do
            trial.stop_intent = StopIntent.PAUSE
            _request(s, trial, principal, EventReason.ACTIVATED,
                     "activated while it was being paused: it goes back to the queue as "
                     "soon as it has stopped")
            return
        transition(s, trial, TrialState.QUEUED, reason=EventReason.ACTIVATED,
                   actor=principal.name,
                   message="back in the queue; it resumes from its latest checkpoint")

    return _control(store, principal, trial_id, Action.ACTIVATE, "activated", activate)


def restart_trial(store: Store, principal: Principal, trial_id: int
                  ) -> api.TrialDescription:
    """Stop a running trial and queue it again at once, from its latest checkpoint: no
    failure, no budget used.

    Raises:
        Conflict: it has ended or is SUSPECT; it is not running (queued or paused: nothing
            to restart; restarting already); it is being stopped for another reason; or its
            experiment is not ACTIVE.
    """
    def restart(s: Session, trial: Trial) -> None:
        if trial.stop_intent is StopIntent.RESTART and not trial.stop_requested:
            return
        _check_stoppable(trial, "restarted")
        _require_active(trial, "restarted")
        if trial.state not in (TrialState.STARTING, TrialState.RUNNING):
            waiting = {TrialState.QUEUED: "it is queued and starts from its latest "
                                          "checkpoint when it runs",
                       TrialState.PAUSED: f"`muster trial activate {trial.id}` queues it",
                       TrialState.RESTARTING: "it is between two attempts already"}
            raise Conflict(f"trial {trial.id} is {trial.state}; only a running trial can be "
                           f"restarted: {waiting[trial.state]}")
        _request(s, trial, principal, EventReason.RESTART_REQUESTED,
                 "restarting this trial: it stops (it can checkpoint first) and goes back "
                 "to the queue at once; it resumes from its latest checkpoint, and no "
                 "failure or restart budget is counted")
        trial.stop_intent = StopIntent.RESTART

    return _control(store, principal, trial_id, Action.RESTART, "restarted", restart)


# -- what the four share ---------------------------------------------------------------------


def _control(store: Store, principal: Principal, trial_id: int, action: Action, done: str,
             act: Callable[[Session, Trial], None]) -> api.TrialDescription:
    """`act` on the trial, locked, once the caller may and the trial has not come to rest;
    then the trial as `describe_trial` shows it."""
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        authorize_on(principal, action, trial.experiment, f"trial {trial_id}")
        s.refresh(trial, with_for_update=True)  # one control at a time, and the supervisor's
        if trial.state is TrialState.SUSPECT:
            raise Conflict(f"trial {trial_id} is SUSPECT: it exited 0 but failed a "
                           f"verification, and a review decides it (`muster trial review "
                           f"{trial_id} --approve|--reject --note ...`); it cannot be {done}")
        if trial.state.is_terminal():
            raise Conflict(f"trial {trial_id} is already {trial.state}; an ended trial cannot "
                           f"be {done} (a new experiment can start from its checkpoint: "
                           f"searcher.source_trial_id: {trial_id})")
        act(s, trial)
    return describe_trial(store, trial_id)


def _check_stoppable(trial: Trial, done: str) -> None:
    """Refuse to pause or restart a trial that is being stopped for good or by its searcher."""
    if trial.stop_requested:
        raise Conflict(f"trial {trial.id} is being killed; it cannot be {done}")
    if trial.stop_intent is StopIntent.EARLY_STOP:
        raise Conflict(f"trial {trial.id} is being stopped early by its searcher (its results "
                       f"up to there count); it cannot be {done}")


def _require_active(trial: Trial, done: str) -> None:
    exp = trial.experiment
    if exp.state is ExperimentState.ACTIVE and not exp.stop_requested:
        return
    words = "being killed" if exp.stop_requested and not exp.state.is_terminal() else exp.state
    hint = (f"; `muster experiment activate {exp.id}` resumes its trials"
            if exp.state is ExperimentState.PAUSED and not exp.stop_requested else "")
    raise Conflict(f"trial {trial.id}'s experiment {exp.id} is {words}; a trial can be {done} "
                   f"only while its experiment is ACTIVE{hint}")


def _request(s: Session, trial: Trial, principal: Principal, reason: EventReason,
             message: str) -> None:
    record_event(s, entity="trial", entity_id=trial.id, reason=reason, actor=principal.name,
                 message=message, experiment_id=trial.experiment_id, trial_id=trial.id)
