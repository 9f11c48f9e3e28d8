"""Fixtures shared by the whole suite: databases on both backends, and a migrated store.

PostgreSQL tests use the server at 127.0.0.1:5432 (trust auth, user `postgres`, database
`test`) and get a fresh database each. Without that server they are skipped, unless
MUSTER_REQUIRE_POSTGRES=1 says it must be there (CI), in which case they fail.
"""

from __future__ import annotations

import os
import secrets
import shutil
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
def _fresh_pg_database(admin_conninfo: str, template: str | None = None) -> Iterator[str]:
    """Create a PostgreSQL database (empty, or a copy of `template`), yield its URL, then
    drop it."""
    name = f"muster_t_{secrets.token_hex(6)}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(admin_conninfo, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"{copy}')
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
# A test that asks for one of these starts real servers or processes, wherever it is.
LIFECYCLE_FIXTURES = frozenset({"server", "client", "rig", "sqlite_rig"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `lifecycle` what starts real processes, also where its module does not say so."""
    for item in items:
        if LIFECYCLE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.lifecycle)


@pytest.fixture(scope="session", autouse=True)
def _own_credentials(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test sees the tokens of the person running the tests: no MUSTER_TOKEN, and a
    credentials file (`muster login`) of the session's own."""
    saved = {name: os.environ.get(name) for name in ("MUSTER_TOKEN", "XDG_CONFIG_HOME")}
    os.environ.pop("MUSTER_TOKEN", None)
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


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


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated once per session: each test's store is a copy of it."""
    path = tmp_path_factory.mktemp("template") / "muster.db"
    with _migrated_store(f"sqlite:///{path}"):
        pass
    return path


@pytest.fixture(scope="session")
def _pg_template(_postgres_server: str) -> Iterator[str]:
    """A PostgreSQL database migrated once per session: each test's store is a copy of it
    (CREATE DATABASE ... TEMPLATE), which costs a fraction of running the migrations."""
    with _fresh_pg_database(_postgres_server) as url:
        with _migrated_store(url):
            pass
        yield url.rsplit("/", 1)[1]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store on each backend in turn, migrated to the newest schema (a copy of a
    database the migrations made once; `tests/store/test_migrations.py` runs them)."""
    if request.param == "sqlite":
        path = tmp_path / "db" / "muster.db"
        path.parent.mkdir()
        shutil.copyfile(request.getfixturevalue("_sqlite_template"), path)
        copied = Store(f"sqlite:///{path}")
        yield copied
        copied.dispose()
        return
    template = request.getfixturevalue("_pg_template")
    with _fresh_pg_database(request.getfixturevalue("_postgres_server"), template) as url:
        copied = Store(url)
        yield copied
        copied.dispose()


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
