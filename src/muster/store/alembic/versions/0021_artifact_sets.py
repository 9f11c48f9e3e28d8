"""A trial's artifact set (issue 35): the files its final attempt left that its config names.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06

- `artifact_sets`: one row per trial and final attempt, `pending` from the transaction that
  ends the trial until the storage worker copied its files (`muster.artifacts`); then
  uploaded to checkpoint storage as `<uuid>/` (`storage_state`, as a checkpoint's `state`).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "artifact_sets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("trial_id", sa.Integer(), sa.ForeignKey("trials.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.JSON(), nullable=False),
        sa.Column("skipped_count", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("collected_at", sa.Float(), nullable=True),
        sa.Column("uuid", sa.String(length=36), nullable=False, unique=True),
        sa.Column("storage_state", sa.String(length=16), nullable=False),
        sa.Column("storage", sa.JSON(), nullable=True),
        sa.Column("stored_at", sa.Float(), nullable=True),
        sa.Column("upload_tries", sa.Integer(), nullable=False),
        sa.Column("next_try_at", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.UniqueConstraint("trial_id", "attempt"),
    )
    op.create_index("ix_artifact_sets_trial_id", "artifact_sets", ["trial_id"])
    op.create_index("ix_artifact_sets_state", "artifact_sets", ["state"])
    op.create_index("ix_artifact_sets_storage_state", "artifact_sets", ["storage_state"])


def downgrade() -> None:
    op.drop_index("ix_artifact_sets_storage_state", table_name="artifact_sets")
    op.drop_index("ix_artifact_sets_state", table_name="artifact_sets")
    op.drop_index("ix_artifact_sets_trial_id", table_name="artifact_sets")
    op.drop_table("artifact_sets")
