"""Nodes: where each replica runs, the bad-node circuit breaker's record of each node, and
each trial's waits for cluster room (CAPACITY).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

Replicas launched before this revision keep `node` null; the API shows their `host`
instead (one machine, the launcher was local).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("replicas", sa.Column("node", sa.String(128), nullable=True))
    op.add_column("trials", sa.Column("capacity_waits", sa.Integer(), server_default="0",
                                      nullable=False))
    op.create_table(
        "cluster_nodes",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("failed_trials", sa.JSON(), nullable=False),
        sa.Column("quarantined_at", sa.Float(), nullable=True),
        sa.Column("quarantine_reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cluster_nodes"),
    )


def downgrade() -> None:
    op.drop_table("cluster_nodes")
    # In place (SQLite 3.35+ and PostgreSQL), as 0011's downgrade.
    op.execute("ALTER TABLE replicas DROP COLUMN node")
    op.execute("ALTER TABLE trials DROP COLUMN capacity_waits")
