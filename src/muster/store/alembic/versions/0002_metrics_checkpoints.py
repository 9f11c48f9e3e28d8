"""Metrics, ingestion cursors, checkpoints, and the trial's verification columns.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Frozen like 0001: every column is spelled out. JSON columns that may hold NaN/±Infinity
are plain JSON here; `muster.store.models.NonFiniteJSON` encodes those values in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW_TRIAL_COLUMNS = ("manifest", "verification", "early_stopped", "queue_reason")


def upgrade() -> None:
    _add_trial_columns()
    _create_metrics()
    _create_ingest_cursors()
    _create_checkpoints()


def downgrade() -> None:
    for table in ("checkpoints", "ingest_cursors", "metrics"):
        op.drop_table(table)
    with op.batch_alter_table("trials") as batch:
        for column in reversed(NEW_TRIAL_COLUMNS):
            batch.drop_column(column)


def _add_trial_columns() -> None:
    # add_column only: SQLite adds these in place, without copying the trials table.
    op.add_column("trials", sa.Column("manifest", sa.JSON(), nullable=True))
    op.add_column("trials", sa.Column("verification", sa.JSON(), nullable=True))
    op.add_column(
        "trials",
        sa.Column("early_stopped", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("trials", sa.Column("queue_reason", sa.Text(), nullable=True))


def _create_metrics() -> None:
    op.create_table(
        "metrics",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name=op.f("fk_metrics_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metrics")),
    )
    op.create_index("ix_metrics_trial_id_kind_step", "metrics", ["trial_id", "kind", "step"])


def _create_ingest_cursors() -> None:
    op.create_table(
        "ingest_cursors",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("file_kind", sa.String(length=16), nullable=False),
        sa.Column("byte_offset", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name=op.f("fk_ingest_cursors_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ingest_cursors")),
        sa.UniqueConstraint(
            "trial_id", "attempt", "rank", "file_kind",
            name=op.f("uq_ingest_cursors_trial_id_attempt_rank_file_kind"),
        ),
    )


def _create_checkpoints() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("intact", sa.Boolean(), nullable=False),
        sa.Column("problem", sa.Text(), nullable=True),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name=op.f("fk_checkpoints_trial_id_trials"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("trial_id", "name", name=op.f("uq_checkpoints_trial_id_name")),
    )
    op.create_index(op.f("ix_checkpoints_trial_id"), "checkpoints", ["trial_id"])
