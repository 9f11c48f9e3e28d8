"""A trial's own source checkpoint (issue 38): population-based training.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07

- `trials.source_checkpoint_id`: the checkpoint a trial starts from while it has none of its
  own, when that is not its experiment's warm start: a PBT member's parent's checkpoint
  (`muster.search.pbt`). No foreign key, like `experiments.source_checkpoint_id`; indexed, so
  GC finds what holds a checkpoint. The lineage itself is in `trials.search_state`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("trials", sa.Column("source_checkpoint_id", sa.Integer(), nullable=True))
    op.create_index("ix_trials_source_checkpoint_id", "trials", ["source_checkpoint_id"])


def downgrade() -> None:
    op.drop_index("ix_trials_source_checkpoint_id", table_name="trials")
    # In place: a batch copy would drop the trials table, which other tables point at.
    op.execute("ALTER TABLE trials DROP COLUMN source_checkpoint_id")
