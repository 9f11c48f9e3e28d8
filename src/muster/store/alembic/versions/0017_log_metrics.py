"""Metrics read from rank logs (issue 30, item 5).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06

- `metrics.source`: where a report was read, "harness" (a metrics file; every report stored
  before this migration) or "log" (`verify.metrics_from_log` and the built-in recognisers).
- `ingest_cursors.lines` and `.reports`: for a rank log's cursor (`file_kind` "log"), the
  newlines before its offset and the metric lines recognised there, so that line numbers
  and running steps go on where the last read stopped.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("metrics", sa.Column("source", sa.String(length=8), nullable=False,
                                       server_default="harness"))
    op.add_column("ingest_cursors", sa.Column("lines", sa.BigInteger(), nullable=False,
                                              server_default="0"))
    op.add_column("ingest_cursors", sa.Column("reports", sa.BigInteger(), nullable=False,
                                              server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("ingest_cursors") as batch:
        batch.drop_column("reports")
        batch.drop_column("lines")
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("source")
