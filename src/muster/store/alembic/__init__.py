"""The store's Alembic migrations; Alembic loads these files itself (see `Store.upgrade`)."""
