"""Configs that use a warm standby declare `harness: true`.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30

`harness: true` (the entrypoint calls muster.harness.init() on every rank) became a config
key, and `failure_policy.warm_standby` now requires it. Muster only ever started a standby
for a script that had checked in through the harness, so a stored config with the standby
on says `harness: true`; without this its experiment could no longer be read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_experiments = sa.table("experiments", sa.column("id", sa.Integer),
                        sa.column("config", sa.JSON))


def upgrade() -> None:
    connection = op.get_bind()
    for row in connection.execute(sa.select(_experiments.c.id, _experiments.c.config)):
        config: dict[str, Any] = dict(row.config or {})
        policy = config.get("failure_policy") or {}
        if policy.get("warm_standby") and "harness" not in config:
            config["harness"] = True
            connection.execute(_experiments.update().where(_experiments.c.id == row.id)
                               .values(config=config))


def downgrade() -> None:
    connection = op.get_bind()
    for row in connection.execute(sa.select(_experiments.c.id, _experiments.c.config)):
        config = dict(row.config or {})
        if config.pop("harness", None) is not None:
            connection.execute(_experiments.update().where(_experiments.c.id == row.id)
                               .values(config=config))
