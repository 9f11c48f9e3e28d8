"""Web sessions remember the credential that opened them (issue 29).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05

- `tokens.opened_with`: a web session's API token (its id), None for a password login. A
  session ends when that token is revoked or expires (`muster.services.tokens`); the index
  finds a token's sessions when it is revoked.
- `tokens.address`: the client's address when the session was opened, for the list of
  sessions (`muster session list`).

Sessions opened before this migration have neither: they are treated as password logins,
and end by the latest 12 h after their login, as every session does.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tokens", sa.Column("opened_with", sa.String(16), nullable=True))
    op.add_column("tokens", sa.Column("address", sa.String(64), nullable=True))
    op.create_index("ix_tokens_opened_with", "tokens", ["opened_with"])


def downgrade() -> None:
    op.drop_index("ix_tokens_opened_with", table_name="tokens")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("address")
        batch.drop_column("opened_with")
