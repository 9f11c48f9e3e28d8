"""The model registry (issue 35): named models and their versions, each a trial's checkpoint
with its lineage.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(length=128), nullable=False, unique=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model_id", sa.Integer(), sa.ForeignKey("models.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("trial_id", sa.Integer(), sa.ForeignKey("trials.id"), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), sa.ForeignKey("checkpoints.id"),
                  nullable=False),
        sa.Column("checkpoint_uuid", sa.String(length=36), nullable=False),
        sa.Column("verified", sa.Boolean(), nullable=False),
        sa.Column("accepted_unverified", sa.JSON(), nullable=True),
        sa.Column("lineage", sa.JSON(), nullable=False),
        sa.Column("registered_by", sa.String(length=64), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("model_id", "version"),
    )
    op.create_index("ix_model_versions_model_id", "model_versions", ["model_id"])
    op.create_index("ix_model_versions_trial_id", "model_versions", ["trial_id"])
    op.create_index("ix_model_versions_checkpoint_id", "model_versions", ["checkpoint_id"])


def downgrade() -> None:
    op.drop_index("ix_model_versions_checkpoint_id", table_name="model_versions")
    op.drop_index("ix_model_versions_trial_id", table_name="model_versions")
    op.drop_index("ix_model_versions_model_id", table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_table("models")
