"""Warm standby attempts: the next attempt's replicas, started ahead and waiting.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

An attempt with `standby` true has been launched but is not active: its replicas wait in
`muster.harness.init()` until a retry promotes it (`standby` becomes false) or the trial
no longer needs it (it ends CANCELED).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "attempts",
        sa.Column("standby", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("standby")
