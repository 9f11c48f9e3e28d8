"""The store's connection to its database: engines, sessions, migrations.

`Store.session_scope()` is the one place where database errors become `StoreError`, so the
rest of muster never sees a SQLAlchemy or driver exception. The schema is created and
changed only by the Alembic migrations in `muster/store/alembic/`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from muster.errors import StoreError

ALEMBIC_DIR = Path(__file__).with_name("alembic")
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
# What the database can fail with: every driver error, and waiting too long for the pool.
_DATABASE_ERRORS = (DBAPIError, PoolTimeoutError)


def redact(url: str | URL) -> str:
    """The URL as text with its password replaced by `***`, safe for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", str(url))


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for muster's migrations, built in code (no alembic.ini needed).

    Also what a developer uses to write a new migration:
    `command.revision(alembic_config(url), autogenerate=True, message="...")`.
    """
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    if url is not None:
        # ConfigParser treats % as interpolation; URLs may contain %-escapes.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


class Store:
    """A muster database: SQLite (`sqlite:///path`) or PostgreSQL
    (`postgresql+psycopg://user@host:port/db`)."""

    def __init__(self, url: str) -> None:
        self.url = _normalize(url)
        self.name = redact(self.url)
        self.engine = _create_engine(self.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Store({self.name!r})"

    @property
    def session_factory(self) -> sessionmaker[Session]:
        """What makes this store's sessions: where session events are listened for (the
        notifications' outbox, `muster.notifications.Router`)."""
        return self._sessions

    @contextmanager
    def session_scope(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error.

        Raises:
            StoreError: the database failed (unreachable, locked, constraint violated...).
        """
        session = self._sessions()
        try:
            with self._translate_errors():
                yield session
                session.commit()
        except BaseException:
            self._rollback_quietly(session)
            raise
        finally:
            session.close()

    @contextmanager
    def _translate_errors(self) -> Iterator[None]:
        """Turn database errors raised inside into `StoreError` naming this database."""
        try:
            yield
        except _DATABASE_ERRORS as exc:
            raise StoreError(f"The database {self.name} failed: {_cause(exc)}") from exc

    def upgrade(self) -> None:
        """Migrate the schema to the newest revision (creates it in an empty database)."""
        config = alembic_config()
        with self._translate_errors(), self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    def check_schema(self) -> None:
        """Raise `StoreError` unless the database's schema is at this muster's newest revision.

        Raises:
            StoreError: the database is behind (or empty), ahead of this muster, or unreachable.
        """
        script = ScriptDirectory.from_config(alembic_config())
        wanted = set(script.get_heads())
        with self._translate_errors(), self.engine.connect() as connection:
            current = set(MigrationContext.configure(connection).get_current_heads())
        if current == wanted:
            return
        known = {rev.revision for rev in script.walk_revisions()}
        if current - known:
            raise StoreError(
                f"The database {self.name} is at schema revision {_revs(current)}, which this "
                f"version of muster does not know ({_revs(wanted)} is its newest); "
                "upgrade muster or use another database."
            )
        raise StoreError(
            f"The database {self.name} is at schema revision {_revs(current)} but muster "
            f"needs {_revs(wanted)}; run the migration (Store.upgrade()) to bring it up to date."
        )

    def dispose(self) -> None:
        """Close every pooled connection (e.g. before the database is deleted)."""
        self.engine.dispose()

    @staticmethod
    def _rollback_quietly(session: Session) -> None:
        # The rollback of a broken connection can fail too; the original error is the news.
        try:
            session.rollback()
        except _DATABASE_ERRORS:
            session.invalidate()


def _normalize(url: str) -> str:
    """Check the URL names a supported backend; a bare `postgresql://` means psycopg 3."""
    unsupported = StoreError(
        "muster stores to sqlite:///path or postgresql+psycopg://user@host:port/db, "
        f"got {redact(url)!r}"
    )
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise unsupported from exc
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername not in ("sqlite", "sqlite+pysqlite", "postgresql+psycopg"):
        raise unsupported
    return parsed.render_as_string(hide_password=False)


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _create_sqlite_engine(parsed)
    return create_engine(
        parsed, pool_pre_ping=True, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S}
    )


def _create_sqlite_engine(url: URL) -> Engine:
    """SQLite tuned for several writers: WAL, and BEGIN IMMEDIATE with a 30 s busy wait.

    With pysqlite's default deferred BEGIN, a transaction that reads and then writes fails
    at once with "database is locked" when another writer got there first (the busy wait
    does not apply to that upgrade). Taking the write lock when the transaction begins makes
    concurrent writers queue up instead. This is SQLAlchemy's documented recipe.
    """
    if url.database and url.database != ":memory:":
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite emits no BEGIN; we do, below
        cursor = dbapi_connection.cursor()
        for pragma in (
            "journal_mode=WAL",
            "synchronous=NORMAL",
            "foreign_keys=ON",
            f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _cause(exc: Exception) -> str:
    """The driver's own words on one line, without the SQL statement and parameters."""
    original = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = " ".join(str(original).split()) or "(no message)"
    return f"{type(original).__name__}: {text}"


def _revs(revisions: set[str]) -> str:
    return ", ".join(sorted(revisions)) if revisions else "none (the schema was never created)"
