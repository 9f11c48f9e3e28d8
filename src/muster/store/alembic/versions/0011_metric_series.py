"""Metric series: each trial's metrics' best values and curves, kept with the reports.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

Trials that already have reports get no series here: they are marked `series_partial`, and
what would be read from their series is read from their reports instead, as before (see
`muster.store.series`). Reports stored from now on are folded into series as they come.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_series",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("reports", sa.BigInteger(), nullable=False),
        sa.Column("lowest", sa.Float(), nullable=True),
        sa.Column("highest", sa.Float(), nullable=True),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.Column("curve", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"],
                                name="fk_metric_series_trial_id_trials", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_metric_series"),
        sa.UniqueConstraint("trial_id", "kind", "name",
                            name="uq_metric_series_trial_id_kind_name"),
    )
    op.add_column("trials", sa.Column("series_partial", sa.Boolean(),
                                      server_default=sa.false(), nullable=False))
    op.execute("UPDATE trials SET series_partial = TRUE "
               "WHERE id IN (SELECT DISTINCT trial_id FROM metrics)")


def downgrade() -> None:
    # In place (SQLite 3.35+ and PostgreSQL), as 0009's downgrade.
    op.execute("ALTER TABLE trials DROP COLUMN series_partial")
    op.drop_table("metric_series")
