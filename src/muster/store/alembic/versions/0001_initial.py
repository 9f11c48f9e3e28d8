"""The initial schema: experiments, trials, attempts, replicas and the event log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Written from `muster.store.models` as it stood; a migration is frozen once released, so it
spells every column out instead of importing the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _create_experiments()
    _create_trials()
    _create_attempts()
    _create_replicas()
    _create_events()


def downgrade() -> None:
    for table in ("events", "replicas", "attempts", "trials", "experiments"):
        op.drop_table(table)


def _create_experiments() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_yaml", sa.Text(), nullable=False),
        sa.Column("context_dir", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
        sa.UniqueConstraint("uuid", name=op.f("uq_experiments_uuid")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_experiments_state"), "experiments", ["state"])


def _create_trials() -> None:
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("hparams", sa.JSON(), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("replica_restarts", sa.Integer(), nullable=False),
        sa.Column("trial_retries", sa.Integer(), nullable=False),
        sa.Column("internal_retries", sa.Integer(), nullable=False),
        sa.Column("user_error_retries", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_trials_experiment_id_experiments"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trials")),
        sa.UniqueConstraint("uuid", name=op.f("uq_trials_uuid")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_trials_experiment_id"), "trials", ["experiment_id"])
    op.create_index(op.f("ix_trials_state"), "trials", ["state"])


def _create_attempts() -> None:
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name=op.f("fk_attempts_trial_id_trials")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("trial_id", "number", name=op.f("uq_attempts_trial_id_number")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_attempts_state"), "attempts", ["state"])
    op.create_index(op.f("ix_attempts_trial_id"), "attempts", ["trial_id"])


def _create_replicas() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("log_path", sa.Text(), nullable=False),
        sa.Column("shim_pid", sa.Integer(), nullable=True),
        sa.Column("shim_start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.String(length=32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("max_rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_replicas_attempt_id_attempts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replicas")),
        sa.UniqueConstraint("attempt_id", "rank", name=op.f("uq_replicas_attempt_id_rank")),
    )
    op.create_index(op.f("ix_replicas_attempt_id"), "replicas", ["attempt_id"])


def _create_events() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("entity", sa.String(length=16), nullable=False),
        sa.Column("entity_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=True),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("from_state", sa.String(length=20), nullable=True),
        sa.Column("to_state", sa.String(length=20), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_at"), "events", ["at"])
    op.create_index(op.f("ix_events_experiment_id"), "events", ["experiment_id"])
    op.create_index(op.f("ix_events_trial_id"), "events", ["trial_id"])
