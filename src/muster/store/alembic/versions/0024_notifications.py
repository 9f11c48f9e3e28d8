"""Notifications (issue 36): users' subscriptions, the outbox written with each event, and
the delivery log.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "notification_subscriptions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_notification_subscriptions_user_id", "notification_subscriptions",
                    ["user_id"])
    op.create_table(
        "notification_outbox",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("event_id", "target"),
    )
    op.create_index("ix_notification_outbox_event_id", "notification_outbox", ["event_id"])
    op.create_index("ix_notification_outbox_state", "notification_outbox", ["state"])
    op.create_index("ix_notification_outbox_next_at", "notification_outbox", ["next_at"])
    op.create_table(
        "notification_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("outbox_id", sa.Integer(),
                  sa.ForeignKey("notification_outbox.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("elapsed_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_notification_deliveries_outbox_id", "notification_deliveries",
                    ["outbox_id"])


def downgrade() -> None:
    op.drop_index("ix_notification_deliveries_outbox_id", table_name="notification_deliveries")
    op.drop_table("notification_deliveries")
    op.drop_index("ix_notification_outbox_next_at", table_name="notification_outbox")
    op.drop_index("ix_notification_outbox_state", table_name="notification_outbox")
    op.drop_index("ix_notification_outbox_event_id", table_name="notification_outbox")
    op.drop_table("notification_outbox")
    op.drop_index("ix_notification_subscriptions_user_id",
                  table_name="notification_subscriptions")
    op.drop_table("notification_subscriptions")
