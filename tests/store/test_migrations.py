"""The schema comes from the migrations alone, and it matches the models."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from muster.errors import StoreError
from muster.store import Base, Store


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
