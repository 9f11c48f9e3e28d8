"""One bad experiment never stops the others.

Each per-trial and per-experiment step of a pass runs under `Isolation.trial` or
`Isolation.experiment`. An unexpected error in that step (a stored config today's code
cannot read, a path the operating system refuses, a bug) ends only that trial — FAILED with
reason INTERNAL — or that experiment — ERROR, its unfinished trials ended with it — with
the error in the message and an event, its processes asked to stop; the pass goes on with
the rest. Without this, one such experiment made every pass fail at the same step, and no
trial of any experiment started.

A database error is nobody's trial's fault: it fails the pass, which the orchestrator
retries with a backoff, rather than ending good trials for an outage.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from muster.errors import StoreError
from muster.launch.base import Launcher
from muster.states import AttemptState, EventReason, ExperimentState, Reason, TrialState
from muster.store import Experiment, Trial, transition
from muster.supervise.context import ACTOR, SupervisorContext

__all__ = ["Isolation", "end_trial_now"]

log = logging.getLogger(__name__)

SYSTEMIC = (SQLAlchemyError, StoreError)  # the store failed, not the trial
MAX_ERROR_CHARS = 500


@dataclass
class Isolation:
    ctx: SupervisorContext

    @contextmanager
    def trial(self, trial_id: int, step: str) -> Iterator[None]:
        """Run one trial's step; an unexpected error ends that trial (INTERNAL)."""
        try:
            yield
        except SYSTEMIC:
            raise
        except Exception as exc:  # noqa: BLE001 - trial_failed logs and records it
            self.trial_failed(trial_id, step, exc)

    def trial_failed(self, trial_id: int, step: str, exc: Exception) -> None:
        """End the trial for an unexpected error in `step` (logged with its traceback)."""
        if isinstance(exc, SYSTEMIC):
            raise exc
        log.error("trial %s: unexpected error %s; ending the trial", trial_id, step,
                  exc_info=exc)
        self.end_trial(trial_id, f"muster hit an unexpected error {step} ({describe(exc)}) "
                                 "and ended this trial so that the others go on; the server "
                                 "log has the traceback")

    @contextmanager
    def experiment(self, experiment_id: int, step: str) -> Iterator[None]:
        """Run one experiment's step; an unexpected error ends that experiment (ERROR)."""
        try:
            yield
        except SYSTEMIC:
            raise
        except Exception as exc:  # logged with its traceback, recorded, ended
            log.exception("experiment %s: unexpected error %s; ending the experiment",
                          experiment_id, step)
            self.end_experiment(experiment_id, f"muster hit an unexpected error {step} "
                                               f"({describe(exc)}) and ended this experiment "
                                               "so that the others go on; the server log has "
                                               "the traceback")

    def end_trial(self, trial_id: int, message: str) -> None:
        with self.ctx.store.session_scope() as s:
            end_trial_now(s, self.ctx.launcher, s.get_one(Trial, trial_id), message)

    def end_experiment(self, experiment_id: int, message: str) -> None:
        with self.ctx.store.session_scope() as s:
            experiment = s.get_one(Experiment, experiment_id)
            for trial in experiment.trials:
                end_trial_now(s, self.ctx.launcher, trial,
                              f"its experiment ended ERROR: {message}")
            state = experiment.state
            if not state.is_terminal():
                transition(s, experiment, ExperimentState.ERROR,
                           reason=EventReason.INTERNAL_ERROR, actor=ACTOR, message=message)


def end_trial_now(s: Session, launcher: Launcher, trial: Trial, message: str) -> None:
    """End a trial that muster cannot go on with: its live attempts' replicas are asked to
    stop (the launcher stops them, recorded first) and the attempts end FAILED; the trial
    ends FAILED (CANCELED if it was paused), reason INTERNAL. A SUSPECT trial waits for its
    review, as ever; an ended one stays as it is."""
    state = trial.state
    if state.is_terminal() or state is TrialState.SUSPECT:
        return
    for attempt in trial.attempts:
        if attempt.state not in AttemptState.live():
            continue
        for rank in sorted({r.rank for r in attempt.replicas}):
            try:
                launcher.cancel(Path(attempt.run_dir), rank)
            except Exception:  # one stop that fails must not stop the others
                log.exception("trial %s attempt %s rank %s: the stop request failed",
                              trial.id, attempt.number, rank)
        transition(s, attempt, AttemptState.FAILED, reason=Reason.INTERNAL, actor=ACTOR,
                   message=message)
    if state is TrialState.PAUSED:
        transition(s, trial, TrialState.CANCELED, reason=Reason.INTERNAL, actor=ACTOR,
                   message=message)
        return
    if state is TrialState.QUEUED:
        transition(s, trial, TrialState.STARTING, reason=EventReason.LAUNCHING, actor=ACTOR)
    transition(s, trial, TrialState.FAILED, reason=Reason.INTERNAL, actor=ACTOR,
               message=message)


def describe(exc: BaseException) -> str:
    """`Type: message`, cut to a size an event can hold."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"
