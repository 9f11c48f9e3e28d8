"""The example tests run on the supervise tests' rig (SQLite only: the examples cost
processes, not database round trips)."""

from tests.supervise.conftest import home, sqlite_rig, sqlite_store

__all__ = ["home", "sqlite_rig", "sqlite_store"]
