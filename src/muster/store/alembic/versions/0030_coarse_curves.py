"""A coarse copy of each metric series' curve (issue 38): an experiment's learning curves.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07

- `metric_series.coarse`: the curve in at most 32 buckets (`downsample.Series.coarse`),
  written with the curve. `GET /experiments/{id}/curves` of hundreds of trials, a few points
  each, reads these instead of every curve's 250 buckets. Null for rows written before (the
  curve is read for those) and for resource series.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("metric_series", sa.Column("coarse", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE metric_series DROP COLUMN coarse")
