"""Store: connection settings, session_scope, error translation, concurrent writers."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from muster.errors import StoreError
from muster.store import Experiment, Store, redact
from tests.store.rows import add_experiment


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _count_experiments(store: Store) -> int:
    with store.session_scope() as session:
        return session.scalar(select(func.count()).select_from(Experiment)) or 0


def test_sqlite_settings(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'a' / 'b' / 'muster.db'}")
    try:
        with store.engine.connect() as connection:
            pragma = {
                name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }
        assert pragma == {
            "journal_mode": "wal",
            "synchronous": 1,  # NORMAL
            "foreign_keys": 1,
            "busy_timeout": 30_000,
        }
        assert (tmp_path / "a" / "b" / "muster.db").exists()
    finally:
        store.dispose()


def test_sqlite_transactions_take_the_write_lock_at_begin(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'muster.db'}")
    try:
        with store.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            # BEGIN IMMEDIATE makes this connection the writer; a second one must wait.
            other = store.engine.raw_connection()
            try:
                other.execute("PRAGMA busy_timeout=0")
                with pytest.raises(Exception, match="locked"):
                    other.execute("BEGIN IMMEDIATE")
            finally:
                other.close()
    finally:
        store.dispose()


def test_session_scope_commits(store: Store) -> None:
    with store.session_scope() as session:
        add_experiment(session)
    assert _count_experiments(store) == 1


def test_session_scope_rolls_back_on_error(store: Store) -> None:
    with pytest.raises(ValueError, match="boom"), store.session_scope() as session:
        add_experiment(session)
        raise ValueError("boom")
    assert _count_experiments(store) == 0


def test_objects_stay_readable_after_the_scope(store: Store) -> None:
    with store.session_scope() as session:
        experiment = add_experiment(session, name="kept")
    assert experiment.name == "kept"
    assert experiment.id > 0


def test_a_unique_violation_becomes_a_store_error_naming_the_database(store: Store) -> None:
    with store.session_scope() as session:
        taken = add_experiment(session).uuid
    with pytest.raises(StoreError) as caught, store.session_scope() as session:
        add_experiment(session, name="first")
        session.add(
            Experiment(
                uuid=taken, name="dup", config={}, config_yaml="", context_dir="", state="ACTIVE"
            )
        )
    assert store.name in str(caught.value)
    assert "uuid" in str(caught.value).lower()
    assert _count_experiments(store) == 1  # "first" was rolled back with the duplicate


def test_an_unreachable_database_is_a_store_error_without_the_password() -> None:
    url = f"postgresql+psycopg://muster:s3cret@127.0.0.1:{_closed_port()}/muster"
    store = Store(url)
    try:
        with pytest.raises(StoreError) as caught, store.session_scope() as session:
            session.execute(text("SELECT 1"))
    finally:
        store.dispose()
    message = str(caught.value)
    assert f"muster:***@127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}/muster" in message
    assert "s3cret" not in message
    assert "OperationalError" in message


def test_an_unreachable_database_fails_upgrade_with_a_store_error() -> None:
    store = Store(f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/muster")
    try:
        with pytest.raises(StoreError, match="The database postgresql"):
            store.upgrade()
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:pw@h:5432/d", "postgresql+psycopg://u:***@h:5432/d"),
        ("postgresql+psycopg://u@h/d", "postgresql+psycopg://u@h/d"),
        ("sqlite:////var/muster.db", "sqlite:////var/muster.db"),
        ("not a url ://u:pw@h", "not a url ://u:***@h"),
    ],
)
def test_redact_hides_only_the_password(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize("url", ["mysql://u@h/d", "nonsense", "sqlite+aiosqlite:///x.db"])
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(StoreError, match="sqlite:///path or postgresql"):
        Store(url)


def test_plain_postgresql_urls_mean_psycopg() -> None:
    store = Store("postgresql://u@h/d")
    assert store.url == "postgresql+psycopg://u@h/d"
    store.dispose()


def test_eight_threads_writing_at_once_all_succeed(store: Store) -> None:
    start = threading.Barrier(8)
    ids: list[int] = []
    errors: list[BaseException] = []

    def create(n: int) -> None:
        try:
            start.wait()
            for _ in range(5):
                with store.session_scope() as session:
                    # Read, then write: the pattern that fails without BEGIN IMMEDIATE.
                    session.scalar(select(func.count()).select_from(Experiment))
                    ids.append(add_experiment(session, name=f"thread-{n}").id)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(ids)) == 40
    assert _count_experiments(store) == 40
