"""One spelling per word: stop intents and event reasons as `muster.states` spells them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

- `trials.pause_requested` ("paused", "preempted", "early_stop") becomes
  `trials.stop_intent`, holding `StopIntent` values ("pause", "preempt", "early_stop").
- A trial the searcher stopped early ended with the reason "early stopped" while the
  decision before it was "early stop": both are "early stop" now, in `trials.reason` and in
  the events. The downgrade tells them apart again by the move: the move to SUCCEEDED was
  "early stopped".

The values are rewritten with plain SQL: the ORM refuses to change events (the log is
append-only for the application), and a migration is not the application.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INTENTS = {"paused": "pause", "preempted": "preempt", "early_stop": "early_stop"}
OLD_EARLY_STOPPED, EARLY_STOP = "early stopped", "early stop"


def upgrade() -> None:
    _rename_column("trials", "pause_requested", "stop_intent")
    for old, new in _INTENTS.items():
        _rewrite("trials", "stop_intent", old, new)
    _rewrite("trials", "reason", OLD_EARLY_STOPPED, EARLY_STOP)
    _rewrite("events", "reason", OLD_EARLY_STOPPED, EARLY_STOP)


def downgrade() -> None:
    for old, new in _INTENTS.items():
        _rewrite("trials", "stop_intent", new, old)
    _rename_column("trials", "stop_intent", "pause_requested")
    op.execute(sa.text("UPDATE trials SET reason = :old WHERE reason = :new AND state = "
                       "'SUCCEEDED'").bindparams(old=OLD_EARLY_STOPPED, new=EARLY_STOP))
    op.execute(sa.text("UPDATE events SET reason = :old WHERE reason = :new AND to_state = "
                       "'SUCCEEDED'").bindparams(old=OLD_EARLY_STOPPED, new=EARLY_STOP))


def _rewrite(table: str, column: str, old: str, new: str) -> None:
    op.execute(sa.text(f"UPDATE {table} SET {column} = :new WHERE {column} = :old")
               .bindparams(old=old, new=new))


def _rename_column(table: str, old: str, new: str) -> None:
    # SQLite (3.25+) and PostgreSQL both rename in place; a batch copy of `trials` would
    # have to drop a table that other tables' foreign keys point at.
    op.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
