"""Drills (issue 37): the user's experiment run once clean and once per fault.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07

- `drills`: one drill, its options, its state;
- `drill_runs`: its runs in order (the clean run, then one per fault), each an experiment,
  when its fault was injected and what muster said (`outcome`);
- `experiments.drill_id`, `drill_fault`, `drill_fs_bytes`: an experiment that is a drill's
  run, which one, and for disk-full the size of its trials' run-directory file system.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "drills",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("config_yaml", sa.Text(), nullable=False),
        sa.Column("source_experiment_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
    )
    op.create_index("ix_drills_owner_id", "drills", ["owner_id"])
    op.create_index("ix_drills_state", "drills", ["state"])
    op.create_index("ix_drills_source_experiment_id", "drills", ["source_experiment_id"])
    op.create_table(
        "drill_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("drill_id", sa.Integer(), sa.ForeignKey("drills.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("fault", sa.String(32), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("injected_at", sa.Float(), nullable=True),
        sa.Column("injection", sa.Text(), nullable=True),
        sa.Column("outcome", sa.JSON(), nullable=True),
        sa.Column("skip_reason", sa.Text(), nullable=True),
        sa.UniqueConstraint("drill_id", "position"),
    )
    op.create_index("ix_drill_runs_drill_id", "drill_runs", ["drill_id"])
    op.create_index("ix_drill_runs_experiment_id", "drill_runs", ["experiment_id"])
    op.add_column("experiments", sa.Column("drill_id", sa.Integer(), nullable=True))
    op.add_column("experiments", sa.Column("drill_fault", sa.String(32), nullable=True))
    op.add_column("experiments", sa.Column("drill_fs_bytes", sa.BigInteger(), nullable=True))
    op.create_index("ix_experiments_drill_id", "experiments", ["drill_id"])


def downgrade() -> None:
    op.drop_index("ix_experiments_drill_id", "experiments")
    op.execute("ALTER TABLE experiments DROP COLUMN drill_fs_bytes")
    op.execute("ALTER TABLE experiments DROP COLUMN drill_fault")
    op.execute("ALTER TABLE experiments DROP COLUMN drill_id")
    op.drop_table("drill_runs")
    op.drop_table("drills")
