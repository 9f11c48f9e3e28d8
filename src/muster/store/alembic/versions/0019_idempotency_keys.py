"""A create's Idempotency-Key, so a repeated POST /experiments creates nothing more (issue 33).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

- `idempotency_keys`: (user, key) once, the sha256 of the request, the ids of the
  experiments it created, and when; written in the create's own transaction
  (`muster.services.idempotency`), pruned after 24 h. An existing store starts empty.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column("experiment_ids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"],
                                name=op.f("fk_idempotency_keys_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency_keys")),
        sa.UniqueConstraint("user_id", "key", name=op.f("uq_idempotency_keys_user_id_key")),
    )
    op.create_index(op.f("ix_idempotency_keys_created_at"), "idempotency_keys",
                    ["created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_idempotency_keys_created_at"), table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
