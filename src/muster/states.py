"""The states of experiments, trials and attempts, the exit reasons, and the legal moves.

Values are plain strings so the same words appear in the database, the API, the CLI and
the UI. The transition tables here are the whole state machine; `muster.store.transitions`
is the one function that applies them.
"""

from __future__ import annotations

from enum import Enum


class ExperimentState(str, Enum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"

    def is_terminal(self) -> bool:
        return self in _EXPERIMENT_TERMINAL


class TrialState(str, Enum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    PAUSED = "PAUSED"
    SUCCEEDED = "SUCCEEDED"
    SUSPECT = "SUSPECT"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    def is_terminal(self) -> bool:
        return self in _TRIAL_TERMINAL

    def is_settled(self) -> bool:
        """True once no process will run for the trial again unless a person acts: the
        terminal states and SUSPECT (which waits for a review)."""
        return self in _TRIAL_TERMINAL or self is TrialState.SUSPECT

    def is_active(self) -> bool:
        """True while the trial holds (or is about to hold) running processes."""
        return self in (TrialState.STARTING, TrialState.RUNNING, TrialState.RESTARTING)


class AttemptState(str, Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    def is_terminal(self) -> bool:
        return self in _ATTEMPT_TERMINAL


class Reason(str, Enum):
    """Why a replica ended: the classification of `muster.launch.exits.classify_exit`."""

    OK = "OK"
    PERMANENT_ERROR = "PERMANENT_ERROR"
    USER_ERROR = "USER_ERROR"
    TRANSIENT = "TRANSIENT"
    OOM = "OOM"
    STOPPED = "STOPPED"
    INFRA = "INFRA"
    LOST = "LOST"
    STALLED = "STALLED"
    INTERNAL = "INTERNAL"


_EXPERIMENT_TERMINAL = frozenset(
    {ExperimentState.COMPLETED, ExperimentState.CANCELED, ExperimentState.ERROR}
)
_TRIAL_TERMINAL = frozenset({TrialState.SUCCEEDED, TrialState.FAILED, TrialState.CANCELED})
_ATTEMPT_TERMINAL = frozenset(
    {AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELED}
)

E, T, A = ExperimentState, TrialState, AttemptState

EXPERIMENT_MOVES: dict[ExperimentState, frozenset[ExperimentState]] = {
    E.ACTIVE: frozenset({E.PAUSED, E.COMPLETED, E.CANCELED, E.ERROR}),
    E.PAUSED: frozenset({E.ACTIVE, E.CANCELED}),
    E.COMPLETED: frozenset(),
    E.CANCELED: frozenset(),
    E.ERROR: frozenset(),
}

TRIAL_MOVES: dict[TrialState, frozenset[TrialState]] = {
    T.QUEUED: frozenset({T.STARTING, T.PAUSED, T.CANCELED}),
    T.STARTING: frozenset({T.RUNNING, T.RESTARTING, T.PAUSED, T.FAILED, T.CANCELED}),
    T.RUNNING: frozenset(
        {T.RESTARTING, T.PAUSED, T.SUCCEEDED, T.SUSPECT, T.FAILED, T.CANCELED}
    ),
    T.RESTARTING: frozenset({T.STARTING, T.PAUSED, T.FAILED, T.CANCELED}),
    T.PAUSED: frozenset({T.QUEUED, T.CANCELED}),
    # The only way out of SUSPECT is a recorded review (see REVIEW_ONLY_MOVES).
    T.SUSPECT: frozenset({T.SUCCEEDED, T.FAILED}),
    T.SUCCEEDED: frozenset(),
    T.FAILED: frozenset(),
    T.CANCELED: frozenset(),
}

ATTEMPT_MOVES: dict[AttemptState, frozenset[AttemptState]] = {
    A.STARTING: frozenset({A.RUNNING, A.FAILED, A.CANCELED}),
    A.RUNNING: frozenset({A.SUCCEEDED, A.FAILED, A.CANCELED}),
    A.SUCCEEDED: frozenset(),
    A.FAILED: frozenset(),
    A.CANCELED: frozenset(),
}

# Moves that only a person's review may make; the transition function demands a review actor.
REVIEW_ONLY_MOVES: frozenset[tuple[TrialState, TrialState]] = frozenset(
    {(T.SUSPECT, T.SUCCEEDED), (T.SUSPECT, T.FAILED)}
)

del E, T, A
