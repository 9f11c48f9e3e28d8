"""The one door for state changes (invariant 3), and the append-only event log.

Every change of an experiment's, trial's or attempt's state goes through `transition`: it
locks the row, checks the move against the tables in `muster.states`, stamps the times,
records why, and appends an `Event`. Nothing else writes `state`, and nothing updates or
deletes an event.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Mapper, Session, SessionTransaction, class_mapper

from muster.errors import IllegalTransition
from muster.states import (
    ATTEMPT_MOVES,
    EXPERIMENT_MOVES,
    REVIEW_ONLY_MOVES,
    REVIEW_REASONS,
    TRIAL_MOVES,
    AttemptState,
    EventReason,
    ExperimentState,
    Reason,
    TrialState,
)
from muster.store.actors import is_system
from muster.store.models import Attempt, Event, Experiment, Trial, now

State = ExperimentState | TrialState | AttemptState
Entity = Experiment | Trial | Attempt
# Why: how a replica ended, or one of the words of a move or decision (one spelling each).
Why = Reason | EventReason

# Column widths, checked here so that SQLite (which ignores them) and PostgreSQL (which
# refuses) treat a too-long value the same way.
MAX_REASON = 32
MAX_ACTOR = 64


@dataclass(frozen=True)
class _Machine:
    """The state machine of one kind of entity."""

    name: str
    states: type[ExperimentState] | type[TrialState] | type[AttemptState]
    moves: Mapping[Any, frozenset[Any]]

    def parse(self, value: str, entity_id: int) -> State:
        try:
            return self.states(value)
        except ValueError:
            names = ", ".join(self.states)
            raise IllegalTransition(
                f"{self.name} {entity_id}: {value!r} is not a {self.name} state (one of {names})"
            ) from None


_MACHINES: dict[type[Entity], _Machine] = {
    Experiment: _Machine("experiment", ExperimentState, EXPERIMENT_MOVES),
    Trial: _Machine("trial", TrialState, TRIAL_MOVES),
    Attempt: _Machine("attempt", AttemptState, ATTEMPT_MOVES),
}


def transition(
    session: Session,
    obj: Entity,
    to_state: State | str,
    *,
    reason: Why,
    actor: str,
    message: str | None = None,
) -> Event:
    """Move `obj` to `to_state` if the state machine allows it, and record the move.

    The current state is read under a row lock (re-read with FOR UPDATE on PostgreSQL; on
    SQLite, whose transactions hold the whole database from their start, only where this
    transaction did not load the row itself), so two writers cannot both move the same row
    from the same state. The event is inserted with the transaction's next flush. The row
    keeps why it is in its current state (`reason` and `message` on trials and attempts,
    `message` on experiments); the event keeps the history.

    Raises:
        IllegalTransition: the move is not legal from the current state (which includes any
            move out of a terminal state), or it needs a review and this is not one (a
            review's reason, by a person).
    """
    word = _word(reason)
    _check_widths(word, actor)
    machine = _MACHINES[type(obj)]
    _lock(session, obj)
    current = machine.parse(obj.state, obj.id)
    target = machine.parse(to_state, obj.id)
    _check_move(machine, obj.id, current, target, actor, reason)
    at = now()
    _stamp(obj, target, at, word, message)
    experiment_id, trial_id = _owners(obj)
    return _append(
        session,
        Event(
            at=at,
            entity=machine.name,
            entity_id=obj.id,
            experiment_id=experiment_id,
            trial_id=trial_id,
            from_state=current,
            to_state=target,
            reason=word,
            actor=actor,
            message=message,
        ),
    )


def record_event(
    session: Session,
    *,
    entity: str,
    entity_id: int,
    reason: Why,
    actor: str,
    message: str | None,
    experiment_id: int | None = None,
    trial_id: int | None = None,
) -> Event:
    """Record a decision that is not a state change, e.g. "retrying the trial, retry 2 of 3"."""
    word = _word(reason)
    _check_widths(word, actor)
    return _append(
        session,
        Event(
            at=now(),
            entity=entity,
            entity_id=entity_id,
            experiment_id=experiment_id,
            trial_id=trial_id,
            reason=word,
            actor=actor,
            message=message,
        ),
    )


def _word(reason: Why | str) -> str:
    """The stored word of `reason` (tests of this module pass plain words)."""
    return str(reason)


def _check_widths(reason: str, actor: str) -> None:
    if not reason or len(reason) > MAX_REASON:
        raise ValueError(f"reason must be 1 to {MAX_REASON} characters, got {reason!r}")
    if not actor or len(actor) > MAX_ACTOR:
        raise ValueError(f"actor must be 1 to {MAX_ACTOR} characters, got {actor!r}")


def _lock(session: Session, obj: Entity) -> None:
    """Load the row's current values into `obj` under a row lock (FOR UPDATE).

    On SQLite the lock is the whole database, taken by BEGIN IMMEDIATE (see `Store`) before
    the transaction's first statement: a row this transaction loaded is current already,
    and only an object from elsewhere (an earlier session) is read again.
    """
    if obj in session and _fresh(session, obj):
        return
    if obj not in session:
        session.add(obj)  # an object from an earlier session_scope, or a new one
    session.flush()  # the caller's pending changes first, so the refresh keeps them
    # The row's columns only: its relationships, loaded already, stay loaded (a refresh of
    # everything would expire them and load each again on its next use).
    session.refresh(obj, attribute_names=_columns(type(obj)), with_for_update=True)


@functools.cache
def _columns(kind: type[Entity]) -> tuple[str, ...]:
    return tuple(column.key for column in class_mapper(kind).column_attrs)


_LOADED = "muster.loaded"  # session.info: the objects loaded in its current transaction


def _fresh(session: Session, obj: Entity) -> bool:
    """Whether `obj` was loaded in this session's transaction on SQLite (whose lock, held
    since its start, makes the loaded values the current ones)."""
    loaded = session.info.get(_LOADED)
    return loaded is not None and obj in loaded and session.get_bind().dialect.name == "sqlite"


@event.listens_for(Session, "loaded_as_persistent")
def _note_loaded(session: Session, instance: object) -> None:
    if isinstance(instance, Experiment | Trial | Attempt):
        session.info.setdefault(_LOADED, weakref.WeakSet()).add(instance)


@event.listens_for(Session, "after_transaction_end")
def _forget_loaded(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost: its lock is gone
        session.info.pop(_LOADED, None)


def _check_move(
    machine: _Machine, entity_id: int, current: State, target: State, actor: str,
    reason: Why | str,
) -> None:
    where = f"{machine.name} {entity_id} is {current}"
    if current.is_terminal():
        raise IllegalTransition(f"{where} (terminal); it cannot move to {target}")
    allowed = machine.moves[current]
    if target not in allowed:
        options = ", ".join(sorted(allowed))
        raise IllegalTransition(
            f"{where}; it cannot move to {target} (it can move to {options})"
        )
    if (current, target) in REVIEW_ONLY_MOVES and (reason not in REVIEW_REASONS
                                                   or is_system(actor)):
        raise IllegalTransition(
            f"{where}; only a person's review can move it to {target}, and this move "
            f"({_word(reason)!r} by {actor!r}) is not one"
        )


def _stamp(obj: Entity, target: State, at: float, reason: str, message: str | None) -> None:
    """Write the new state and its times and explanation onto the row."""
    obj.state = target
    obj.updated_at = at
    if _ends_run(target) and obj.ended_at is None:
        obj.ended_at = at
    obj.message = message
    if isinstance(obj, Experiment):
        return
    obj.reason = reason
    if isinstance(obj, Trial) and (_ends_run(target) or target is TrialState.PAUSED):
        obj.queue_reason = None  # a trial at rest or paused waits for nothing
    if (target is TrialState.RUNNING or target is AttemptState.RUNNING) and obj.started_at is None:
        obj.started_at = at


def _ends_run(state: State) -> bool:
    """True when the entity's run is over: a terminal state, or SUSPECT awaiting review.

    A reviewed SUSPECT trial keeps the time its run ended, not the time of the review.
    """
    return state.is_terminal() or state is TrialState.SUSPECT


def _owners(obj: Entity) -> tuple[int | None, int | None]:
    """The (experiment_id, trial_id) an event about `obj` is filed under."""
    if isinstance(obj, Experiment):
        return obj.id, None
    if isinstance(obj, Trial):
        return obj.experiment_id, obj.id
    return obj.trial.experiment_id, obj.trial_id


def _append(session: Session, new_event: Event) -> Event:
    """Add the event to the transaction: inserted by the next flush (at the latest, the
    commit), in the order the events were added."""
    session.add(new_event)
    return new_event


@event.listens_for(Event, "before_update")
def _refuse_update(_mapper: Mapper[Event], _connection: Any, target: Event) -> None:
    raise RuntimeError(f"event {target.id} cannot be changed: the event log is append-only")


@event.listens_for(Event, "before_delete")
def _refuse_delete(_mapper: Mapper[Event], _connection: Any, target: Event) -> None:
    raise RuntimeError(f"event {target.id} cannot be deleted: the event log is append-only")
