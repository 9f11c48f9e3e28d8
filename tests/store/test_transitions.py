"""The one door for state changes: every (from, to) pair of every state machine."""

from __future__ import annotations

import re
import threading
from typing import Any, TypeVar

import pytest
from sqlalchemy import inspect, select
from sqlalchemy.orm import Session

from muster.errors import IllegalTransition
from muster.states import (
    ATTEMPT_MOVES,
    EXPERIMENT_MOVES,
    REVIEW_ONLY_MOVES,
    TRIAL_MOVES,
    AttemptState,
    ExperimentState,
    TrialState,
)
from muster.store import Attempt, Event, Experiment, Store, Trial, record_event, transition
from muster.store.transitions import State
from tests.store.rows import add_attempt, add_experiment, add_trial

Entity = Experiment | Trial | Attempt
EntityT = TypeVar("EntityT", Experiment, Trial, Attempt)


def _every_pair(states: type[State]) -> list[Any]:
    return [pytest.param(a, b, id=f"{a.value}->{b.value}") for a in states for b in states]


def _add(store: Store, kind: type[EntityT], state: str) -> EntityT:
    """A row of `kind` in `state`, with its parents, committed."""
    with store.session_scope() as session:
        row = _add_row(session, kind, state)
    assert isinstance(row, kind)
    return row


def _add_row(session: Session, kind: type[Entity], state: str) -> Entity:
    if kind is Experiment:
        return add_experiment(session, state=state)
    trial_state = state if kind is Trial else "RUNNING"
    trial = add_trial(session, add_experiment(session), state=trial_state)
    return trial if kind is Trial else add_attempt(session, trial, state=state)


def _snapshot(store: Store, kind: type[Entity], entity_id: int) -> dict[str, Any]:
    with store.session_scope() as session:
        row = session.get_one(kind, entity_id)
        return {attr.key: getattr(row, attr.key) for attr in inspect(row).mapper.column_attrs}


def _events(store: Store, about: Entity | None = None) -> list[Event]:
    """The events in order; only those about `about` when given (on a shared store)."""
    query = select(Event).order_by(Event.id)
    if about is not None:
        entity = type(about).__tablename__.removesuffix("s")
        query = query.where(Event.entity == entity, Event.entity_id == about.id)
    with store.session_scope() as session:
        return list(session.scalars(query))


def _move(store: Store, obj: Entity, target: State | str, actor: str = "system:supervisor",
          reason: str = "test") -> Event:
    with store.session_scope() as session:
        row = session.get_one(type(obj), obj.id)
        assert isinstance(row, Experiment | Trial | Attempt)
        return transition(session, row, target, reason=reason, actor=actor, message="why")


def _owners(obj: Entity) -> tuple[int, int | None]:
    if isinstance(obj, Experiment):
        return obj.id, None
    if isinstance(obj, Trial):
        return obj.experiment_id, obj.id
    return obj.trial.experiment_id, obj.trial_id


def _check_pair(
    store: Store, kind: type[EntityT], current: State, target: State, legal: bool
) -> None:
    obj = _add(store, kind, current.value)
    before = _snapshot(store, kind, obj.id)
    review = (current, target) in REVIEW_ONLY_MOVES
    actor, reason = ("alice", "review approved") if review else ("system:supervisor", "test")
    if not legal:
        with pytest.raises(IllegalTransition, match=f"is {current.value}"):
            _move(store, obj, target, actor, reason)
        assert _snapshot(store, kind, obj.id) == before
        assert _events(store, about=obj) == []
        return
    _move(store, obj, target, actor, reason)
    after = _snapshot(store, kind, obj.id)
    (event,) = _events(store, about=obj)
    assert after["state"] == target.value
    assert after["updated_at"] == event.at >= before["updated_at"]
    assert (event.experiment_id, event.trial_id) == _owners(obj)
    assert (event.from_state, event.to_state) == (current.value, target.value)
    assert (event.reason, event.actor, event.message) == (reason, actor, "why")


@pytest.mark.parametrize(("current", "target"), _every_pair(ExperimentState))
def test_experiment_moves(
    shared_store: Store, current: ExperimentState, target: ExperimentState
) -> None:
    _check_pair(shared_store, Experiment, current, target, target in EXPERIMENT_MOVES[current])


@pytest.mark.parametrize(("current", "target"), _every_pair(TrialState))
def test_trial_moves(shared_store: Store, current: TrialState, target: TrialState) -> None:
    _check_pair(shared_store, Trial, current, target, target in TRIAL_MOVES[current])


@pytest.mark.parametrize(("current", "target"), _every_pair(AttemptState))
def test_attempt_moves(shared_store: Store, current: AttemptState, target: AttemptState) -> None:
    _check_pair(shared_store, Attempt, current, target, target in ATTEMPT_MOVES[current])


def test_a_terminal_state_is_named_in_the_refusal(store: Store) -> None:
    trial = _add(store, Trial, "FAILED")
    expected = f"trial {trial.id} is FAILED (terminal); it cannot move to RUNNING"
    with pytest.raises(IllegalTransition, match=f"^{re.escape(expected)}$"):
        _move(store, trial, TrialState.RUNNING)


def test_a_stale_object_cannot_overwrite_a_terminal_state(store: Store) -> None:
    trial = _add(store, Trial, "RUNNING")
    trial_id = trial.id  # the failed scope's rollback expires `trial`
    _move(store, trial, TrialState.FAILED)
    assert trial.state == "RUNNING"  # this copy is stale; the database says FAILED
    with pytest.raises(IllegalTransition, match="is FAILED"), store.session_scope() as session:
        transition(session, trial, TrialState.SUCCEEDED, reason="test", actor="supervisor")
    assert _snapshot(store, Trial, trial_id)["state"] == "FAILED"


def test_a_row_loaded_in_an_earlier_transaction_of_the_session_is_read_again(
    store: Store,
) -> None:
    """A transaction trusts only the rows it loaded itself (on SQLite, under its lock): a
    row the same session loaded before a commit is read again under the new lock."""
    trial = _add(store, Trial, "RUNNING")
    with store.session_scope() as session:
        row = session.get_one(Trial, trial.id)
        session.commit()  # the session goes on, in a new transaction, keeping `row` loaded
        _move(store, trial, TrialState.FAILED)  # another writer, meanwhile
        assert row.state == "RUNNING"
        with pytest.raises(IllegalTransition, match="is FAILED"):
            transition(session, row, TrialState.SUCCEEDED, reason="test", actor="supervisor")
    assert _snapshot(store, Trial, trial.id)["state"] == "FAILED"


def test_racing_writers_move_a_row_once(store: Store) -> None:
    trial = _add(store, Trial, "RUNNING")
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def finish(target: TrialState) -> None:
        start.wait()
        try:
            _move(store, trial, target)
            outcomes.append(target.value)
        except IllegalTransition:
            outcomes.append("refused")

    threads = [
        threading.Thread(target=finish, args=(t,)) for t in (TrialState.FAILED, TrialState.CANCELED)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes)[-1] == "refused"
    assert len(_events(store)) == 1


def test_suspect_exits_only_by_review(store: Store) -> None:
    """A review is a review's reason, by a person: not muster's, not another move's."""
    trial = _add(store, Trial, "SUSPECT")
    refused = "only a person's review can move it to SUCCEEDED"
    for actor, reason in (("system:supervisor", "test"), ("alice", "test"),
                          ("system:supervisor", "review approved")):
        with pytest.raises(IllegalTransition, match=refused):
            _move(store, trial, TrialState.SUCCEEDED, actor=actor, reason=reason)
    assert _snapshot(store, Trial, trial.id)["state"] == "SUSPECT"
    _move(store, trial, TrialState.SUCCEEDED, actor="alice", reason="review approved")
    assert _snapshot(store, Trial, trial.id)["state"] == "SUCCEEDED"


def test_trial_times_are_stamped_once(store: Store) -> None:
    trial = _add(store, Trial, "QUEUED")
    for target in ("STARTING", "RUNNING", "RESTARTING", "STARTING", "RUNNING", "SUSPECT"):
        _move(store, trial, target)
    first_run, *_ = (e.at for e in _events(store) if e.to_state == "RUNNING")
    suspect = _events(store)[-1].at
    row = _snapshot(store, Trial, trial.id)
    assert (row["started_at"], row["ended_at"]) == (first_run, suspect)
    _move(store, trial, "FAILED", actor="bob", reason="review rejected")
    row = _snapshot(store, Trial, trial.id)
    assert (row["started_at"], row["ended_at"]) == (first_run, suspect)
    assert row["updated_at"] > suspect


@pytest.mark.parametrize("path", [("STARTING", "FAILED"), ("CANCELED",),
                                  ("STARTING", "RUNNING", "SUSPECT"), ("PAUSED",)])
def test_a_trial_that_stops_waiting_forgets_why_it_waited(
    store: Store, path: tuple[str, ...]
) -> None:
    """A trial that ends (or pauses) while queued for slots no longer shows "waiting for ..."."""
    trial = _add(store, Trial, "QUEUED")
    with store.session_scope() as session:
        session.get_one(Trial, trial.id).queue_reason = "waiting for 1 slot (0 of 2 free)"
    for target in path:
        _move(store, trial, target)
    assert _snapshot(store, Trial, trial.id)["queue_reason"] is None


def test_a_running_trial_keeps_its_restart_wait(store: Store) -> None:
    trial = _add(store, Trial, "RUNNING")
    with store.session_scope() as session:
        session.get_one(Trial, trial.id).queue_reason = "restart waits for 1 slot"
    _move(store, trial, "RESTARTING")
    assert _snapshot(store, Trial, trial.id)["queue_reason"] == "restart waits for 1 slot"


def test_attempt_and_experiment_times(store: Store) -> None:
    attempt = _add(store, Attempt, "STARTING")
    assert _snapshot(store, Attempt, attempt.id)["started_at"] is None
    running = _move(store, attempt, AttemptState.RUNNING)
    done = _move(store, attempt, AttemptState.SUCCEEDED)
    row = _snapshot(store, Attempt, attempt.id)
    assert (row["started_at"], row["ended_at"]) == (running.at, done.at)
    experiment = _add(store, Experiment, "ACTIVE")
    _move(store, experiment, ExperimentState.PAUSED)
    assert _snapshot(store, Experiment, experiment.id)["ended_at"] is None
    canceled = _move(store, experiment, ExperimentState.CANCELED)
    assert _snapshot(store, Experiment, experiment.id)["ended_at"] == canceled.at


def test_the_row_keeps_why_it_is_in_its_state(store: Store) -> None:
    attempt = _add(store, Attempt, "RUNNING")
    with store.session_scope() as session:
        row = session.get_one(Attempt, attempt.id)
        transition(session, row, "FAILED", reason="USER_ERROR", actor="supervisor", message="m")
    after = _snapshot(store, Attempt, attempt.id)
    assert (after["reason"], after["message"]) == ("USER_ERROR", "m")


def test_an_object_from_an_earlier_session_can_move(store: Store) -> None:
    trial = _add(store, Trial, "QUEUED")
    with store.session_scope() as session:
        transition(session, trial, TrialState.STARTING, reason="test", actor="scheduler")
    assert trial.state == "STARTING"
    assert _snapshot(store, Trial, trial.id)["state"] == "STARTING"


def test_an_unknown_state_is_refused(store: Store) -> None:
    trial = _add(store, Trial, "QUEUED")
    with pytest.raises(IllegalTransition, match="'BOGUS' is not a trial state"):
        _move(store, trial, "BOGUS")


def test_an_overlong_reason_is_refused_on_every_backend(store: Store) -> None:
    trial = _add(store, Trial, "QUEUED")
    with pytest.raises(ValueError, match="reason"), store.session_scope() as session:
        transition(session, trial, "STARTING", reason="x" * 33, actor="scheduler")


def test_record_event_keeps_a_decision(store: Store) -> None:
    trial = _add(store, Trial, "RESTARTING")
    with store.session_scope() as session:
        record_event(
            session,
            entity="trial",
            entity_id=trial.id,
            reason="retry",
            actor="supervisor",
            message="retrying the trial, retry 2 of 3",
            experiment_id=trial.experiment_id,
            trial_id=trial.id,
        )
    (event,) = _events(store)
    assert (event.from_state, event.to_state, event.message) == (
        None,
        None,
        "retrying the trial, retry 2 of 3",
    )
    assert _snapshot(store, Trial, trial.id)["state"] == "RESTARTING"


@pytest.mark.parametrize("change", ["update", "delete"])
def test_events_are_append_only(store: Store, change: str) -> None:
    _move(store, _add(store, Trial, "QUEUED"), TrialState.STARTING)
    with pytest.raises(RuntimeError, match="append-only"), store.session_scope() as session:
        event = session.scalars(select(Event)).one()
        if change == "update":
            event.message = "rewritten"
        else:
            session.delete(event)
    assert _events(store)[0].message == "why"
