"""What connected a trial's ranks to muster (issue 34).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06

- `trials.integration`: "harness", "lightning", "transformers", "accelerate" or
  "determined" (`muster.states.Integration`), as its latest attempt's rank 0 checked in;
  NULL for a trial none of whose ranks checked in (a plain script).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("trials", sa.Column("integration", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("integration")
