"""Indexes for a store at scale (10,000 queued trials, 10,000 experiments; issue 19).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03

Each pass of the supervisor, and each page of the experiments list, used to read rows it
only filtered (an experiment's row holds its whole config). Now an index answers:

- `ix_trials_queue` (trials: state, priority, id, stop_requested): admission finds the
  waiting trials through it, and after a pass that changed nothing reads only a digest of
  them that it alone holds (`supervise/admission.py`). It replaces `ix_trials_state`,
  whose lookups it serves as well.
- `ix_trials_experiment_state` (trials: experiment_id, state): whether an experiment has a
  trial left to run (`supervise/experiments.py`, which asks it of every active experiment
  each pass) without reading a trial's row. It replaces `ix_trials_experiment_id`.
- `ix_experiments_state_max_trials` (experiments: state, max_trials): the searches still
  drawing trials (`supervise/searching.py`: active, `max_trials` over 1) without reading
  every active experiment's row. It replaces `ix_experiments_state`.
- `ix_experiments_listed` (experiments: archived, delete_requested_at, id): the list's
  count and its pages in id order (`services/listing.py`), up to any offset.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_trials_queue", "trials", ["state", "priority", "id", "stop_requested"])
    op.drop_index("ix_trials_state", table_name="trials")
    op.create_index("ix_trials_experiment_state", "trials", ["experiment_id", "state"])
    op.drop_index("ix_trials_experiment_id", table_name="trials")
    op.create_index("ix_experiments_listed", "experiments",
                    ["archived", "delete_requested_at", "id"])
    op.create_index("ix_experiments_state_max_trials", "experiments", ["state", "max_trials"])
    op.drop_index("ix_experiments_state", table_name="experiments")


def downgrade() -> None:
    op.create_index("ix_experiments_state", "experiments", ["state"])
    op.drop_index("ix_experiments_state_max_trials", table_name="experiments")
    op.drop_index("ix_experiments_listed", table_name="experiments")
    op.create_index("ix_trials_experiment_id", "trials", ["experiment_id"])
    op.drop_index("ix_trials_experiment_state", table_name="trials")
    op.create_index("ix_trials_state", "trials", ["state"])
    op.drop_index("ix_trials_queue", table_name="trials")
