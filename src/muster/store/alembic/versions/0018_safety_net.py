"""What a replica's end says about memory, its log and a stall (issue 31).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

- `replicas.peak_rss_bytes`: the peak resident memory of the replica's process group (its
  cgroup's peak, or the largest sum sampled), for every attempt.
- `replicas.oom_source` and `.oom_limit_bytes`: who named the replica's end an OOM kill
  ("cgroup", "kmsg" or "watchdog") and the limit it hit (NULL: no memory_limit was set).
- `replicas.log_lost_bytes`: output the shim could not write to the log (disk full, EIO).
- `replicas.evidence` and `.stack_summary`: where the evidence bundle of a stalled replica
  lies (relative to the attempt's directory) and the one line its main thread's stack gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("replicas", sa.Column("peak_rss_bytes", sa.BigInteger(), nullable=True))
    op.add_column("replicas", sa.Column("oom_source", sa.String(length=16), nullable=True))
    op.add_column("replicas", sa.Column("oom_limit_bytes", sa.BigInteger(), nullable=True))
    op.add_column("replicas", sa.Column("log_lost_bytes", sa.BigInteger(), nullable=True))
    op.add_column("replicas", sa.Column("evidence", sa.Text(), nullable=True))
    op.add_column("replicas", sa.Column("stack_summary", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        for column in ("stack_summary", "evidence", "log_lost_bytes", "oom_limit_bytes",
                       "oom_source", "peak_rss_bytes"):
            batch.drop_column(column)
