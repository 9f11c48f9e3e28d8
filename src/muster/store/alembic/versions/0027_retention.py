"""Retention (issue 36): when the cluster config's `retention` removed a trial's files.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-09

- `trials.logs_removed_at`: when its replica logs were removed (`retention.logs_after`, or
  with its run);
- `trials.files_removed_at`: when its run directory, its checkpoints not registered and its
  artifacts were removed (`retention.runs_after`).

Each is set in the transaction that records the removal's event, before a file goes, so a
reader answers "removed by retention" (410) rather than with an empty log. Trials recorded
before this migration have neither: nothing removed them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("trials", sa.Column("logs_removed_at", sa.Float(), nullable=True))
    op.add_column("trials", sa.Column("files_removed_at", sa.Float(), nullable=True))


def downgrade() -> None:
    # In place: a batch copy would have to drop the trials table, which other tables'
    # foreign keys point at (SQLite drops a plain column itself since 3.35).
    op.execute("ALTER TABLE trials DROP COLUMN files_removed_at")
    op.execute("ALTER TABLE trials DROP COLUMN logs_removed_at")
