"""The schema comes from the migrations alone, and it matches the models."""

from __future__ import annotations

import json

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError

from muster.config import ExperimentConfig
from muster.errors import StoreError
from muster.services.validation import best_validation
from muster.states import StopIntent
from muster.store import Base, Experiment, Store, Trial
from muster.store.db import alembic_config


def test_migrating_an_empty_database_gives_the_models_schema(store: Store) -> None:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        differences = compare_metadata(context, Base.metadata)
    assert differences == []


def test_migration_creates_every_table(store: Store) -> None:
    tables = set(inspect(store.engine).get_table_names())
    assert tables == set(Base.metadata.tables) | {"alembic_version"}


def test_upgrade_twice_is_harmless(store: Store) -> None:
    store.upgrade()
    store.check_schema()


def test_check_schema_passes_at_head(store: Store) -> None:
    store.check_schema()


def test_check_schema_on_an_empty_database_says_to_migrate(db_url: str) -> None:
    store = Store(db_url)
    try:
        with pytest.raises(StoreError, match=r"never created.*run the migration"):
            store.check_schema()
    finally:
        store.dispose()


def test_check_schema_on_a_newer_database_says_so(store: Store) -> None:
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = 'f00d'")
    with pytest.raises(StoreError, match=r"f00d.*does not know"):
        store.check_schema()


def test_0003_keeps_existing_replicas_as_first_incarnations(db_url: str) -> None:
    """A database with runs, made by the previous version, upgrades without losing a row;
    afterwards a rank may have a second incarnation in the same attempt, not a duplicate."""
    store = Store(db_url)
    try:
        with store.engine.begin() as connection:
            config = alembic_config(db_url)
            config.attributes["connection"] = connection
            command.upgrade(config, "0002")
        with store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO experiments (id, uuid, name, description, labels, config, "
                "config_yaml, context_dir, state, stop_requested, created_at, updated_at) "
                "VALUES (1, 'e', 'x', '', '[]', '{}', '', '/tmp', 'ACTIVE', false, 0, 0)")
            connection.exec_driver_sql(
                "INSERT INTO trials (id, uuid, experiment_id, state, hparams, stop_requested, "
                "replica_restarts, trial_retries, internal_retries, user_error_retries, "
                "created_at, updated_at) VALUES (1, 't', 1, 'RUNNING', '{}', false, 0, 0, 0, 0, "
                "0, 0)")
            connection.exec_driver_sql(
                "INSERT INTO attempts (id, trial_id, number, state, run_dir, created_at, "
                "updated_at) VALUES (1, 1, 1, 'RUNNING', '/tmp/a', 0, 0)")
            connection.exec_driver_sql(
                "INSERT INTO replicas (id, attempt_id, rank, host, log_path) "
                "VALUES (1, 1, 0, 'h', '/tmp/a/rank-0.log'), (2, 1, 1, 'h', '/tmp/a/rank-1.log')")
        store.upgrade()
        with store.engine.begin() as connection:
            rows = connection.exec_driver_sql(
                "SELECT id, rank, incarnation FROM replicas ORDER BY id").all()
            assert [tuple(r) for r in rows] == [(1, 0, 0), (2, 1, 0)]
            connection.exec_driver_sql(
                "INSERT INTO replicas (id, attempt_id, rank, incarnation, host, log_path) "
                "VALUES (3, 1, 1, 1, 'h', '/tmp/a/rank-1.log')")
        with pytest.raises(IntegrityError), store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO replicas (id, attempt_id, rank, incarnation, host, log_path) "
                "VALUES (4, 1, 1, 1, 'h', '/tmp/a/rank-1.log')")
    finally:
        store.dispose()


def test_0005_declares_the_harness_where_a_warm_standby_is_on(db_url: str) -> None:
    """`warm_standby` now needs `harness: true`; a stored config with the standby on gets
    it, so its experiment stays readable; other configs are left as they were."""
    standby = {"name": "a", "entrypoint": ["python", "t.py"],
               "failure_policy": {"warm_standby": True, "trial_retries": 3}}
    plain = {"name": "b", "entrypoint": ["python", "t.py"], "failure_policy": {}}
    store = Store(db_url)
    try:
        config = alembic_config(db_url)
        with store.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "0004")
        with store.engine.begin() as connection:
            for number, stored in enumerate((standby, plain), start=1):
                connection.execute(text(
                    "INSERT INTO experiments (id, uuid, name, description, labels, config, "
                    "config_yaml, context_dir, state, stop_requested, created_at, updated_at) "
                    "VALUES (:id, :uuid, 'x', '', '[]', :config, '', '/tmp', 'ACTIVE', false, "
                    "0, 0)"), {"id": number, "uuid": f"e{number}", "config": json.dumps(stored)})
        store.upgrade()
        with store.session_scope() as s:
            upgraded = {e.id: e.config for e in s.scalars(select(Experiment))}
        assert upgraded == {1: {**standby, "harness": True}, 2: plain}
        assert ExperimentConfig.from_json_dict(upgraded[1]).failure_policy.warm_standby
        with store.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0004")
        with store.engine.begin() as connection:
            rows = connection.execute(text("SELECT id, config FROM experiments ORDER BY id"))
            assert {row.id: _json(row.config) for row in rows} == {1: standby, 2: plain}
    finally:
        store.dispose()


def _json(value: object) -> object:
    return json.loads(value) if isinstance(value, str) else value


def _migrate(store: Store, db_url: str, revision: str, down: bool = False) -> None:
    config = alembic_config(db_url)
    with store.engine.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)


def test_0008_spells_stop_intents_and_reasons_one_way(db_url: str) -> None:
    """Stored pause requests become stop intents and "early stopped" becomes "early stop";
    the downgrade gives back exactly what 0007 held."""
    store = Store(db_url)
    try:
        _migrate(store, db_url, "0007")
        with store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO experiments (id, uuid, name, description, labels, config, "
                "config_yaml, context_dir, state, stop_requested, created_at, updated_at) "
                "VALUES (1, 'e', 'x', '', '[]', '{}', '', '/tmp', 'ACTIVE', false, 0, 0)")
            for trial_id, state, reason, pause in [
                    (1, "RUNNING", "started", "paused"), (2, "RUNNING", "started", "preempted"),
                    (3, "RUNNING", "started", "early_stop"),
                    (4, "SUCCEEDED", "early stopped", None), (5, "QUEUED", None, None)]:
                connection.execute(text(
                    "INSERT INTO trials (id, uuid, experiment_id, state, hparams, stop_requested, "
                    "replica_restarts, trial_retries, internal_retries, user_error_retries, "
                    "created_at, updated_at, number, reason, pause_requested) VALUES (:id, :uuid, "
                    "1, :state, '{}', false, 0, 0, 0, 0, 0, 0, :id, :reason, :pause)"),
                    {"id": trial_id, "uuid": f"t{trial_id}", "state": state, "reason": reason,
                     "pause": pause})
            for event_id, to_state, reason in [(1, None, "early stop"),
                                               (2, "SUCCEEDED", "early stopped"),
                                               (3, "PAUSED", "paused")]:
                connection.execute(text(
                    "INSERT INTO events (id, at, entity, entity_id, experiment_id, trial_id, "
                    "to_state, reason, actor) VALUES (:id, 0, 'trial', 4, 1, 4, :to_state, "
                    ":reason, 'supervisor')"),
                    {"id": event_id, "to_state": to_state, "reason": reason})

        def snapshot(intent_column: str) -> tuple[object, object]:
            with store.engine.begin() as connection:
                trials = connection.execute(text(
                    f"SELECT id, reason, {intent_column} FROM trials ORDER BY id")).all()
                events = connection.execute(text(
                    "SELECT id, reason FROM events ORDER BY id")).all()
            return [tuple(row) for row in trials], [tuple(row) for row in events]

        before = snapshot("pause_requested")
        store.upgrade()
        store.check_schema()
        assert snapshot("stop_intent") == (
            [(1, "started", "pause"), (2, "started", "preempt"), (3, "started", "early_stop"),
             (4, "early stop", None), (5, None, None)],
            [(1, "early stop"), (2, "early stop"), (3, "paused")])
        with store.session_scope() as s:
            intents = {t.id: t.intent for t in s.scalars(select(Trial))}
        assert intents == {1: StopIntent.PAUSE, 2: StopIntent.PREEMPT,
                           3: StopIntent.EARLY_STOP, 4: None, 5: None}
        _migrate(store, db_url, "0007", down=True)
        assert snapshot("pause_requested") == before
    finally:
        store.dispose()


def test_0011_marks_trials_with_reports_partial_and_their_values_still_read(
        db_url: str) -> None:
    """Trials that reported before series existed are read from their reports: their best
    value is the same as before the upgrade; the downgrade drops the series."""
    store = Store(db_url)
    try:
        _migrate(store, db_url, "0010")
        with store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO experiments (id, uuid, name, description, labels, config, "
                "config_yaml, context_dir, state, stop_requested, created_at, updated_at, "
                "priority, max_trials) "
                "VALUES (1, 'e', 'x', '', '[]', '{}', '', '/tmp', 'ACTIVE', false, 0, 0, 42, 2)")
            for trial_id in (1, 2):
                connection.execute(text(
                    "INSERT INTO trials (id, uuid, experiment_id, state, hparams, stop_requested, "
                    "replica_restarts, trial_retries, internal_retries, user_error_retries, "
                    "created_at, updated_at, number, early_stopped, priority) VALUES (:id, "
                    ":uuid, 1, 'SUCCEEDED', '{}', false, 0, 0, 0, 0, 0, 0, :id, false, 42)"),
                    {"id": trial_id, "uuid": f"t{trial_id}"})
            for step, value in ((1, 0.5), (2, 0.25), (3, "NaN")):
                connection.execute(text(
                    "INSERT INTO metrics (trial_id, attempt, rank, kind, step, time, \"values\") "
                    "VALUES (1, 1, 0, 'validation', :step, 0, :values)"),
                    {"step": step, "values": json.dumps({"val_loss": value})})
        store.upgrade()
        store.check_schema()
        with store.session_scope() as s:
            partial = {t.id: t.series_partial for t in s.scalars(select(Trial))}
            assert partial == {1: True, 2: False}
            assert best_validation(s, [1, 2], {"val_loss": True}) == {1: {"val_loss": 0.25}}
        _migrate(store, db_url, "0010", down=True)
        assert "metric_series" not in inspect(store.engine).get_table_names()
    finally:
        store.dispose()


def test_0012_gives_existing_checkpoints_uuids_and_the_local_state(db_url: str) -> None:
    """Checkpoints registered before storage existed stay `local` (the worker uploads them
    later), each with its own uuid; the downgrade drops the columns again."""
    store = Store(db_url)
    try:
        _migrate(store, db_url, "0011")
        with store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO experiments (id, uuid, name, description, labels, config, "
                "config_yaml, context_dir, state, stop_requested, created_at, updated_at, "
                "priority, max_trials) "
                "VALUES (1, 'e', 'x', '', '[]', '{}', '', '/tmp', 'ACTIVE', false, 0, 0, 42, 1)")
            connection.execute(text(
                "INSERT INTO trials (id, uuid, experiment_id, state, hparams, stop_requested, "
                "replica_restarts, trial_retries, internal_retries, user_error_retries, "
                "created_at, updated_at, number, early_stopped, priority, series_partial) "
                "VALUES (1, 't', 1, 'SUCCEEDED', '{}', false, 0, 0, 0, 0, 0, 0, 0, false, 42, "
                "false)"))
            for number in (1, 2):
                connection.execute(text(
                    "INSERT INTO checkpoints (trial_id, name, path, step, size_bytes, "
                    "file_count, metadata, intact, registered_at) VALUES (1, :name, '/x', "
                    ":step, 1, 1, '{}', true, 0)"), {"name": f"step-{number}", "step": number})
        store.upgrade()
        store.check_schema()
        with store.session_scope() as s:
            rows = s.execute(text("SELECT uuid, state, upload_tries FROM checkpoints")).all()
            assert [(state, tries) for _, state, tries in rows] == [("local", 0)] * 2
            assert len({uuid for uuid, _, _ in rows}) == 2 and all(len(u) == 36 for u, *_ in rows)
            archived = s.execute(text("SELECT archived FROM experiments")).scalar_one()
            assert archived in (False, 0)
        _migrate(store, db_url, "0011", down=True)
        columns = {c["name"] for c in inspect(store.engine).get_columns("checkpoints")}
        assert "uuid" not in columns and "state" not in columns
    finally:
        store.dispose()


def test_0015_keeps_open_sessions_as_password_logins_and_downgrades(db_url: str) -> None:
    """A session opened before sessions remembered their credential stays open (as a
    password login's); the columns go away again on a downgrade."""
    store = Store(db_url)
    try:
        _migrate(store, db_url, "0014")
        with store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO users (id, name, display_name, role, active, created_at, "
                "updated_at) VALUES (1, 'ann', '', 'user', true, 0, 0)")
            connection.exec_driver_sql(
                "INSERT INTO tokens (id, user_id, kind, name, secret_hash, created_at) "
                "VALUES ('00000000000000aa', 1, 'session', 'web session', 'h', 0)")
        store.upgrade()
        with store.engine.begin() as connection:
            row = connection.exec_driver_sql(
                "SELECT id, opened_with, address FROM tokens").one()
        assert tuple(row) == ("00000000000000aa", None, None)
        _migrate(store, db_url, "0014", down=True)
        columns = {c["name"] for c in inspect(store.engine).get_columns("tokens")}
        assert "opened_with" not in columns and "address" not in columns
    finally:
        store.dispose()


def test_0019_adds_idempotency_keys_to_an_existing_store_and_downgrades(db_url: str) -> None:
    """A store in use gains the empty table of keys, unique per (user, key); a downgrade
    drops it and leaves the users alone."""
    store = Store(db_url)
    try:
        _migrate(store, db_url, "0018")
        with store.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO users (id, name, display_name, role, active, created_at, "
                "updated_at) VALUES (1, 'ann', '', 'user', true, 0, 0)")
        store.upgrade()
        insert = ("INSERT INTO idempotency_keys (user_id, key, request_sha256, "
                  "experiment_ids, created_at) VALUES (1, 'k', 'h', '[1]', 0)")
        with store.engine.begin() as connection:
            assert connection.exec_driver_sql(
                "SELECT count(*) FROM idempotency_keys").scalar_one() == 0
            connection.exec_driver_sql(insert)
        with pytest.raises(IntegrityError), store.engine.begin() as connection:
            connection.exec_driver_sql(insert)
        _migrate(store, db_url, "0018", down=True)
        assert "idempotency_keys" not in inspect(store.engine).get_table_names()
        with store.engine.begin() as connection:
            assert connection.exec_driver_sql("SELECT name FROM users").scalar_one() == "ann"
    finally:
        store.dispose()
