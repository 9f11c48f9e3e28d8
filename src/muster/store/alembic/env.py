"""Alembic's entry point for muster's migrations.

`muster.store.Store.upgrade()` hands over its own connection (in
`config.attributes["connection"]`), so migrations run with the store's SQLite settings
(WAL, BEGIN IMMEDIATE). Without one, the URL comes from the `sqlalchemy.url` option, as
`muster.store.db.alembic_config(url)` sets it.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from muster.store.db import Store
from muster.store.models import Base


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_offline() -> None:
    """Print the SQL instead of running it (`alembic upgrade head --sql`)."""
    url = context.config.get_main_option("sqlalchemy.url")
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("no database: pass a connection or set the sqlalchemy.url option")
    store = Store(url)  # the store's engine, so SQLite gets its usual settings
    try:
        with store.engine.begin() as own_connection:
            _migrate(own_connection)
    finally:
        store.dispose()


if context.is_offline_mode():
    _run_offline()
else:
    _run_online()
