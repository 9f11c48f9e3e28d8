"""Usage and goodput (issue 36): what an attempt resumed from, and when a stall began.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-08

- `attempts.resumed_from`: the name of the checkpoint of its trial an attempt was given to
  resume from (`MUSTER_LATEST_CHECKPOINT`); usage counts the work before it as kept.
  Attempts recorded before this migration get the one muster gave them by its rule: the
  latest intact checkpoint of the trial registered before the attempt was recorded.
- `replicas.stalled_since`: when a STALLED replica's stall began (its last progress or
  sign of life); stalls from before this migration have none, and count as lost time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("resumed_from", sa.String(length=255), nullable=True))
    op.add_column("replicas", sa.Column("stalled_since", sa.Float(), nullable=True))
    op.execute(
        "UPDATE attempts SET resumed_from = ("
        " SELECT c.name FROM checkpoints c"
        " WHERE c.trial_id = attempts.trial_id AND c.intact"
        " AND c.registered_at <= attempts.created_at"
        " ORDER BY c.step DESC, COALESCE(c.created_at, 0) DESC, c.name DESC LIMIT 1)"
        " WHERE attempts.number > 1")


def downgrade() -> None:
    # In place: a batch copy would have to drop tables that foreign keys point at (SQLite
    # drops a plain column itself since 3.35).
    op.execute("ALTER TABLE replicas DROP COLUMN stalled_since")
    op.execute("ALTER TABLE attempts DROP COLUMN resumed_from")
