"""Checkpoint storage: each checkpoint's uuid, storage state and place; archived
experiments and their GC counts.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

Checkpoints registered before this revision are `local` (in their run directory only); the
server's upload worker copies the intact ones to storage like any new one.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("uuid", sa.String(36), nullable=True))
    checkpoints = sa.table("checkpoints", sa.column("id", sa.Integer),
                           sa.column("uuid", sa.String))
    bind = op.get_bind()
    ids = [row[0] for row in bind.execute(sa.select(checkpoints.c.id))]
    for checkpoint_id in ids:
        bind.execute(checkpoints.update().where(checkpoints.c.id == checkpoint_id)
                     .values(uuid=str(uuid.uuid4())))
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("uuid", existing_type=sa.String(36), nullable=False)
        batch.create_unique_constraint("uq_checkpoints_uuid", ["uuid"])
    op.add_column("checkpoints", sa.Column("state", sa.String(16), server_default="local",
                                           nullable=False))
    op.create_index("ix_checkpoints_state", "checkpoints", ["state"])
    op.add_column("checkpoints", sa.Column("storage", sa.JSON(), nullable=True))
    op.add_column("checkpoints", sa.Column("stored_at", sa.Float(), nullable=True))
    op.add_column("checkpoints", sa.Column("upload_tries", sa.Integer(), server_default="0",
                                           nullable=False))
    op.add_column("checkpoints", sa.Column("next_try_at", sa.Float(), nullable=True))
    op.add_column("checkpoints", sa.Column("error", sa.Text(), nullable=True))
    op.add_column("checkpoints", sa.Column("gc_reason", sa.Text(), nullable=True))
    op.add_column("checkpoints", sa.Column("deleted_at", sa.Float(), nullable=True))
    op.add_column("experiments", sa.Column("archived", sa.Boolean(),
                                           server_default=sa.false(), nullable=False))
    op.add_column("experiments", sa.Column("gc_policy", sa.JSON(), nullable=True))
    op.add_column("experiments", sa.Column("delete_requested_at", sa.Float(), nullable=True))


def downgrade() -> None:
    for column in ("delete_requested_at", "gc_policy", "archived"):
        op.execute(f"ALTER TABLE experiments DROP COLUMN {column}")
    op.drop_index("ix_checkpoints_state", "checkpoints")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_constraint("uq_checkpoints_uuid", type_="unique")
    for column in ("deleted_at", "gc_reason", "error", "next_try_at", "upload_tries",
                   "stored_at", "storage", "state", "uuid"):
        op.execute(f"ALTER TABLE checkpoints DROP COLUMN {column}")
