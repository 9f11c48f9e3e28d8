"""Per-experiment environments: the hash of the environment an experiment's trials run in,
and, per trial, the hash and the freeze of the build it first launched in.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

Existing experiments ran on the server's own interpreter: no hash (NULL).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("experiments", sa.Column("environment_key", sa.String(16), nullable=True))
    op.add_column("trials", sa.Column("environment_key", sa.String(16), nullable=True))
    op.add_column("trials", sa.Column("environment_freeze", sa.Text(), nullable=True))
    op.create_index("ix_trials_environment_key", "trials", ["environment_key"])


def downgrade() -> None:
    op.drop_index("ix_trials_environment_key", table_name="trials")
    # In place (SQLite 3.35+ and PostgreSQL): a batch copy would have to drop tables that
    # other tables' foreign keys point at.
    for table, column in (("trials", "environment_freeze"), ("trials", "environment_key"),
                          ("experiments", "environment_key")):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
