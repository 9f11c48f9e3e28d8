"""Quotas (issue 36): groups of users, their members, and the limits admins set at runtime.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-08

- `groups`, `group_members`: named sets of users (`muster group`); a group's quota holds
  its members together.
- `quotas`: one row per limit an admin set (`muster quota set`) for a user, a group or the
  default (`subject_id` 0); it wins over the cluster config's `quotas` (`value` NULL: no
  limit).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("description", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("name"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "group_members",
        sa.Column("group_id", sa.Integer(), sa.ForeignKey("groups.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("added_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_group_members_user_id", "group_members", ["user_id"])
    op.create_table(
        "quotas",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("subject", sa.String(length=8), nullable=False),
        sa.Column("subject_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Integer(), nullable=True),
        sa.Column("set_by", sa.String(length=32), nullable=False),
        sa.Column("set_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("subject", "subject_id", "kind"),
    )


def downgrade() -> None:
    op.drop_table("quotas")
    op.drop_index("ix_group_members_user_id", table_name="group_members")
    op.drop_table("group_members")
    op.drop_table("groups")
