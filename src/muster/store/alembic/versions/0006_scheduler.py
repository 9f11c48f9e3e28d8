"""The scheduler: priorities, pause and preemption requests, and the GPU table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

Existing experiments and trials get the default priority, 42 (resources.priority did not
exist before; every config had the default).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("experiments", sa.Column("priority", sa.Integer(), server_default="42",
                                           nullable=False))
    op.add_column("trials", sa.Column("priority", sa.Integer(), server_default="42",
                                      nullable=False))
    op.add_column("trials", sa.Column("pause_requested", sa.String(16), nullable=True))
    op.create_index("ix_trials_priority", "trials", ["priority"])
    op.create_table(
        "gpus",
        sa.Column("index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("memory_total", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("present", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], name="fk_gpus_trial_id_trials"),
        sa.PrimaryKeyConstraint("index", name="pk_gpus"),
    )
    op.create_index("ix_gpus_trial_id", "gpus", ["trial_id"])


def downgrade() -> None:
    op.drop_index("ix_gpus_trial_id", table_name="gpus")
    op.drop_table("gpus")
    op.drop_index("ix_trials_priority", table_name="trials")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("pause_requested")
        batch.drop_column("priority")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("priority")
