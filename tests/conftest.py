"""Fixtures shared by the whole suite: databases on both backends, and a migrated store.

PostgreSQL tests use the server at 127.0.0.1:5432 (trust auth, user `postgres`, database
`test`) and get a fresh database each. Without that server they are skipped, unless
MUSTER_REQUIRE_POSTGRES=1 says it must be there (CI), in which case they fail.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from muster.store import Store

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


@pytest.fixture(scope="session")
def _postgres_server() -> str:
    """The admin connection string, once the server has answered; else skip or fail."""
    try:
        psycopg.connect(PG_ADMIN, autocommit=True).close()
    except psycopg.OperationalError as exc:
        cause = " ".join(str(exc).split())
        reason = f"PostgreSQL at 127.0.0.1:5432 is not reachable: {cause}"
        if os.environ.get("MUSTER_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{reason} (and MUSTER_REQUIRE_POSTGRES=1 requires it)")
        pytest.skip(reason)
    return PG_ADMIN


@contextmanager
def _fresh_pg_database(admin_conninfo: str) -> Iterator[str]:
    """Create an empty PostgreSQL database, yield its URL, then drop it."""
    name = f"muster_t_{secrets.token_hex(6)}"
    with psycopg.connect(admin_conninfo, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.format(name=name)
    finally:
        with psycopg.connect(admin_conninfo, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def _migrated_store(url: str) -> Iterator[Store]:
    store = Store(url)
    store.upgrade()
    try:
        yield store
    finally:
        store.dispose()


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture
def pg_url(_postgres_server: str) -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database, dropped after the test."""
    with _fresh_pg_database(_postgres_server) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a fresh, empty database on each backend in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'muster.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A store on `db_url`, migrated to the newest schema."""
    with _migrated_store(db_url) as migrated:
        yield migrated


@pytest.fixture(scope="module", params=BACKENDS)
def shared_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    """A migrated store on each backend, shared by one module's tests (which is faster).

    Tests using it must not assume an empty database: each makes and inspects its own rows.
    """
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'muster.db'}"
        with _migrated_store(url) as migrated:
            yield migrated
        return
    with (
        _fresh_pg_database(request.getfixturevalue("_postgres_server")) as url,
        _migrated_store(url) as migrated,
    ):
        yield migrated
