"""Hyperparameter search: each trial's number in its experiment's search and the searcher's
own notes on it; how many trials an experiment runs.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

Existing trials are number 0 of their experiment (every experiment had one trial) and
existing experiments run one trial.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("experiments", sa.Column("max_trials", sa.Integer(), server_default="1",
                                           nullable=False))
    op.add_column("trials", sa.Column("number", sa.Integer(), server_default="0",
                                      nullable=False))
    op.add_column("trials", sa.Column("search_state", sa.JSON(), nullable=True))
    # A restarted searcher can never draw a trial number twice.
    op.create_index("ux_trials_experiment_number", "trials", ["experiment_id", "number"],
                    unique=True)


def downgrade() -> None:
    op.drop_index("ux_trials_experiment_number", table_name="trials")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("search_state")
        batch.drop_column("number")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("max_trials")
