"""Users, their tokens and web sessions, experiments' owners, events by actor.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

Existing experiments get no owner here (NULL): the server that first meets this database
makes the first admin and gives them every experiment without an owner
(`muster.services.users.bootstrap`), in one transaction, so no experiment is left ownerless.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("display_name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=True),
        sa.Column("unix_user", sa.String(32), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("last_seen_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("name", name="uq_users_name"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(16), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_tokens_user_id_users"),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("secret_hash", name="uq_tokens_secret_hash"),
    )
    op.create_index("ix_tokens_user_id", "tokens", ["user_id"])
    # In place, with its REFERENCES clause: a batch copy (SQLite's way to add a constraint)
    # would have to drop the experiments table, which trials' foreign keys point at.
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE experiments ADD COLUMN owner_id INTEGER "
                   "CONSTRAINT fk_experiments_owner_id_users REFERENCES users (id)")
    else:
        op.add_column("experiments", sa.Column(
            "owner_id", sa.Integer(),
            sa.ForeignKey("users.id", name="fk_experiments_owner_id_users"), nullable=True))
    op.create_index("ix_experiments_owner_id", "experiments", ["owner_id"])
    op.create_index("ix_events_actor", "events", ["actor"])


def downgrade() -> None:
    op.drop_index("ix_events_actor", table_name="events")
    op.drop_index("ix_experiments_owner_id", table_name="experiments")
    op.execute("ALTER TABLE experiments DROP COLUMN owner_id")
    op.drop_index("ix_tokens_user_id", table_name="tokens")
    op.drop_table("tokens")
    op.drop_table("users")
