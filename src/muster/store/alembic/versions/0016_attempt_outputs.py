"""What each attempt's `verify.outputs` files were when it launched (issue 30).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

- `attempts.outputs_before`: per file the config's `verify.outputs` names, its identity in
  the trial's working directory as the attempt launched (`{"path": [inode, size, mtime_ns,
  ctime_ns]}`, null for a file that did not exist). Verification counts a file only if the
  attempt that ended created or changed it. Attempts launched before this migration have
  none: their outputs are judged as before, by their times alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("outputs_before", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("outputs_before")
