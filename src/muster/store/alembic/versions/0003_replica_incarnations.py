"""Replica incarnations (a replica restarted in place keeps its rank, gets a new row) and
the attempt's MASTER_PORT.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

With `restart_scope: replica` a failed replica is relaunched inside the same attempt; each
launch of a rank is one row, numbered by `incarnation` (0 for the first), so every end keeps
its exit code, signal, reason and message (invariant 7). The unique key becomes
(attempt_id, rank, incarnation). SQLite rebuilds the table for the constraint (batch mode).
`attempts.master_port` is the rendezvous port every replica of the attempt was given, so a
replica restarted in place joins the same one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("master_port", sa.Integer(), nullable=True))
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(
            sa.Column("incarnation", sa.Integer(), server_default="0", nullable=False)
        )
        batch.drop_constraint("uq_replicas_attempt_id_rank", type_="unique")
        batch.create_unique_constraint(
            "uq_replicas_attempt_id_rank_incarnation", ["attempt_id", "rank", "incarnation"]
        )


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.drop_constraint("uq_replicas_attempt_id_rank_incarnation", type_="unique")
        batch.create_unique_constraint("uq_replicas_attempt_id_rank", ["attempt_id", "rank"])
        batch.drop_column("incarnation")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("master_port")
