"""The tables: rows of every kind round-trip, relations hold, ids are never reused."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from muster.errors import StoreError
from muster.store import Attempt, Experiment, Replica, Store, Trial
from tests.store.rows import add_attempt, add_experiment, add_replica, add_trial


def test_experiment_trial_attempt_replica_round_trip(store: Store) -> None:
    with store.session_scope() as session:
        experiment = add_experiment(session, name="digits")
        trial = add_trial(session, experiment)
        attempt = add_attempt(session, trial)
        add_replica(session, attempt, rank=0)
        add_replica(session, attempt, rank=1)
    with store.session_scope() as session:
        loaded = session.get_one(Experiment, experiment.id)
        assert loaded.name == "digits"
        assert loaded.config == {"name": "digits"}
        assert loaded.labels == []
        assert loaded.stop_requested is False
        assert [t.hparams for t in loaded.trials] == [{"lr": 0.1}]
        assert [a.number for a in loaded.trials[0].attempts] == [1]
        assert [r.rank for r in loaded.trials[0].attempts[0].replicas] == [0, 1]


def test_update_and_delete_cascade(store: Store) -> None:
    with store.session_scope() as session:
        experiment = add_experiment(session)
        add_replica(session, add_attempt(session, add_trial(session, experiment)))
    with store.session_scope() as session:
        loaded = session.get_one(Experiment, experiment.id)
        loaded.description = "changed"
    with store.session_scope() as session:
        assert session.get_one(Experiment, experiment.id).description == "changed"
        session.delete(session.get_one(Experiment, experiment.id))
    with store.session_scope() as session:
        for table in (Experiment, Trial, Attempt, Replica):
            assert session.scalars(select(table)).all() == []


def test_two_experiments_in_the_same_instant_get_distinct_ids(store: Store) -> None:
    with store.session_scope() as session:
        first, second = add_experiment(session), add_experiment(session)
    assert first.id != second.id
    assert first.uuid != second.uuid
    assert first.created_at == pytest.approx(second.created_at, abs=1.0)


def test_ids_are_not_reused_after_a_delete(store: Store) -> None:
    with store.session_scope() as session:
        gone = add_experiment(session)
    with store.session_scope() as session:
        session.delete(session.get_one(Experiment, gone.id))
    with store.session_scope() as session:
        assert add_experiment(session).id > gone.id


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(StoreError, match=r"(?i)foreign key"), store.session_scope() as session:
        session.add(Trial(experiment_id=12345, state="QUEUED"))


def test_attempt_numbers_are_unique_per_trial(store: Store) -> None:
    with store.session_scope() as session:
        trial = add_trial(session, add_experiment(session))
        add_attempt(session, trial, number=1)
    with pytest.raises(StoreError, match=r"(?i)unique"), store.session_scope() as session:
        add_attempt(session, session.get_one(Trial, trial.id), number=1)
