"""Idempotency keys of `POST /experiments`: a create sent twice with one key creates once.

A client (the web form, `muster experiment create`, the SDK) sends `Idempotency-Key` with a
create. The key is recorded with the ids of the experiments it created, in the transaction
that records them (`record`, called by `experiments.create_experiments`): a key is never
kept without its experiments, nor experiments without their key. A later create with the
same key and the same request is answered with those experiments (`answer_for`); with
another request it is refused. Keys are per user, and kept `KEEP_S` (24 h): each keyed
create deletes the expired ones in its transaction, so the table holds at most a day of
keyed creates.

Two creates racing with one key (a double click) both get past `answer_for`; the store's
unique (user, key) lets one insert its row, and the other's insert fails (SQLite: after
the first commits, its BEGIN IMMEDIATE waits; PostgreSQL: the insert waits on the first's
row), which rolls its experiments back: it raises `KeyTaken`, and the caller answers with
the first's experiments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from muster.errors import Conflict
from muster.git_state import GitState
from muster.store import IdempotencyKey, Store
from muster.store.models import now

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 128
KEY_PATTERN = rf"^[A-Za-z0-9._:-]{{1,{MAX_KEY_LENGTH}}}$"
KEEP_S = 24 * 3600.0  # how long a key is honoured (and kept)
REPLAYED_HEADER = "Idempotent-Replayed"  # "true" on an answer that created nothing


class KeyTaken(Conflict):
    """Another create recorded this key first; its experiments are the answer."""


@dataclass(frozen=True)
class Claim:
    """A create's key: whose, which, and the digest of what it asks (`request_digest`)."""

    user_id: int
    key: str
    request_sha256: str


def request_digest(configs: Sequence[str], context_sha256: str | None,
                   context_from: int | None, git: GitState | None,
                   secret_names: Sequence[str]) -> str:
    """The sha256 (hex) of what a create asks: its configs, its context (the archive's
    sha256, or the experiment it reuses), its git state and the names of its secrets (not
    their values: the store never holds anything derived from a secret)."""
    asked = {"configs": list(configs), "context_sha256": context_sha256,
             "context_from": context_from, "git": None if git is None else git.field(),
             "secrets": sorted(secret_names)}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()


def answer_for(store: Store, claim: Claim) -> list[int] | None:
    """The experiments a create with `claim`'s key made, if one did within KEEP_S; None
    if none did.

    Raises:
        Conflict: the key was used for another request (another digest).
    """
    with store.session_scope() as s:
        row = s.scalars(select(IdempotencyKey).where(
            IdempotencyKey.user_id == claim.user_id, IdempotencyKey.key == claim.key,
            IdempotencyKey.created_at >= now() - KEEP_S)).one_or_none()
        if row is None:
            return None
        if row.request_sha256 != claim.request_sha256:
            raise Conflict(f"the {HEADER} {claim.key!r} was used for another submission "
                           "(other configs, context or secrets); send a new key for a new "
                           "submission")
        return list(row.experiment_ids)


def record(s: Session, claim: Claim) -> IdempotencyKey:
    """Record `claim` in the create's transaction (`s`), first thing, with its experiment ids
    to be set on the row once they are known; the expired keys are deleted.

    Raises:
        KeyTaken: a create with this key has been recorded (the transaction must end).
    """
    s.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < now() - KEEP_S))
    row = IdempotencyKey(user_id=claim.user_id, key=claim.key,
                         request_sha256=claim.request_sha256, experiment_ids=[])
    s.add(row)
    try:
        s.flush()
    except IntegrityError as exc:
        raise KeyTaken(f"a submission with the {HEADER} {claim.key!r} is in progress; "
                       "retry with the same key to get its experiments") from exc
    return row
