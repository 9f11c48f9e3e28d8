"""Warm starts (issue 35): the checkpoint an experiment's trials start from.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07

- `experiments.source_checkpoint_id`: the checkpoint `searcher.source_*` named, resolved
  when the experiment was submitted (no foreign key: that checkpoint's experiment may be
  deleted once this one has ended); indexed, so GC finds what holds a checkpoint.
- `experiments.source`: what the warm start was (checkpoint, trial, model version).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("experiments", sa.Column("source_checkpoint_id", sa.Integer(),
                                           nullable=True))
    op.add_column("experiments", sa.Column("source", sa.JSON(), nullable=True))
    op.create_index("ix_experiments_source_checkpoint_id", "experiments",
                    ["source_checkpoint_id"])


def downgrade() -> None:
    op.drop_index("ix_experiments_source_checkpoint_id", table_name="experiments")
    # In place: a batch copy would have to drop the experiments table, which trials'
    # foreign keys point at (SQLite drops a plain column itself since 3.35).
    op.execute("ALTER TABLE experiments DROP COLUMN source")
    op.execute("ALTER TABLE experiments DROP COLUMN source_checkpoint_id")
