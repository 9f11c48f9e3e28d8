"""API tokens and web sessions: made, looked up by hash, listed, revoked, ended.

A token is `mst_` (an API token) or `mss_` (a web session) and 43 random URL-safe
characters; the store keeps only its SHA-256 (`ApiToken.secret_hash`, unique), so a copy of
the database holds no usable token. A token is shown once, when it is made. Each has a
public id (16 hex digits, random: not guessable from another's) that lists and revocations
name. A request's token is looked up by its hash on every request, with its user: a revoked
or expired token, or one of a deactivated user, is refused by the very next request.

A web session follows the credential that opened it: one opened with an API token ends
when that token is revoked, and by the time it expires; one opened with a password ends
when the user's password changes (except the session that changed it). Deactivating a user
ends all their sessions (their API tokens only stop working, and work again if they are
activated). A user lists and ends their own sessions; an admin, anyone's.

A token from before users existed (43 characters without a prefix, in the home's token
file) is adopted as the first admin's on the first start (`muster.services.users`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from muster import api
from muster.errors import Conflict, InvalidRequest, NotFound, Unauthorized
from muster.services.access import Action, Principal, authorize
from muster.states import EventReason, TokenKind
from muster.store import ApiToken, Store, User, record_event
from muster.store.models import now
from muster.words import count

__all__ = ["MAX_TOKEN_CHARS", "SESSION_SECONDS", "authenticate",
           "create_api_token", "csrf_token", "end_session", "end_sessions", "hash_secret",
           "issue", "list_sessions", "list_tokens", "log_out", "open_session", "revoke_token",
           "session_view", "token_view"]

MAX_TOKEN_CHARS = 200  # longer is no token of ours: refused before it is hashed
MAX_EXPIRY_SECONDS = 3650 * 86_400
SESSION_SECONDS = 12 * 3600  # a web session lasts this long from its login
LAST_USED_EVERY_S = 60.0  # `last_used_at` and `last_seen_at` are written at most this often
MAX_TOKEN_NAME = 100
MAX_API_TOKENS = 100  # a user's API tokens that are not revoked
MAX_SESSIONS = 20  # a user's open web sessions; the oldest ends when one more opens
MAX_ADDRESS_CHARS = 64  # what a session keeps of its client's address


def hash_secret(secret: str) -> str:
    """The stored form of a token: its SHA-256, hex."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def csrf_token(session_secret: str) -> str:
    """The CSRF token of a web session: derived from the session's secret (which the page's
    scripts cannot read: the cookie is HttpOnly), so it needs no storage of its own."""
    return hmac.new(session_secret.encode(), b"muster csrf", hashlib.sha256).hexdigest()


def issue(s: Session, user: User, kind: TokenKind, name: str, *,
          expires_at: float | None = None, secret: str | None = None) -> tuple[ApiToken, str]:
    """A new token of `user` in the caller's transaction: (its row, the secret to show once).
    `secret` adopts an existing one (the home token of a muster from before users)."""
    secret = secret or kind.prefix + secrets.token_urlsafe(32)
    row = ApiToken(id=secrets.token_hex(8), user=user, kind=kind, name=name,
                   secret_hash=hash_secret(secret), expires_at=expires_at)
    s.add(row)
    s.flush()
    return row, secret


def authenticate(store: Store, secret: str, kind: TokenKind) -> Principal:
    """Who `secret` (presented as `kind`) acts as.

    Raises:
        Unauthorized: no such token, revoked, expired, of another kind, or its user is
            deactivated; the message says which and what to do.
    """
    if not secret or len(secret) > MAX_TOKEN_CHARS:
        raise Unauthorized(_unknown(kind))
    with store.session_scope() as s:
        found = s.execute(select(ApiToken, User).join(User, ApiToken.user_id == User.id)
                          .where(ApiToken.secret_hash == hash_secret(secret))).first()
        if found is None:
            raise Unauthorized(_unknown(kind))
        row, user = found
        if row.revoked_at is not None or row.kind is not kind:
            raise Unauthorized(_unknown(kind))
        at = now()
        if row.expires_at is not None and row.expires_at <= at:
            raise Unauthorized(f"{_what(kind)} {row.id} ({row.name}) has expired; "
                               + _fix(kind))
        if not user.active:
            raise Unauthorized(f"user {user.name} is deactivated; an admin can activate "
                               f"them again (muster user activate {user.name})")
        if row.opened_with is not None:
            _check_opener(s, row, at)
        if row.last_used_at is None or at - row.last_used_at >= LAST_USED_EVERY_S:
            row.last_used_at = user.last_seen_at = at
        return Principal(user_id=user.id, name=user.name, role=user.role,
                         token_id=row.id, via_session=kind is TokenKind.SESSION)


def _check_opener(s: Session, session: ApiToken, at: float) -> None:
    """Refuse a web session whose API token no longer works. Revoking a token ends its
    sessions too (`end_sessions`); this also catches a session opened while its token was
    being revoked."""
    token = s.get(ApiToken, session.opened_with)
    if token is None or token.revoked_at is not None or (
            token.expires_at is not None and token.expires_at <= at):
        raise Unauthorized(f"web session {session.id} ended with the API token it was "
                           f"opened with ({session.opened_with}); log in again")


def _what(kind: TokenKind) -> str:
    return "token" if kind is TokenKind.API else "web session"


def _fix(kind: TokenKind) -> str:
    if kind is TokenKind.SESSION:
        return "log in again"
    return ("make a new one with `muster login URL` or `muster token create`; the server's "
            "own admin token is in $MUSTER_HOME/secrets/token")


def _unknown(kind: TokenKind) -> str:
    if kind is TokenKind.SESSION:
        return "not logged in (no such web session, or it ended); log in again"
    return ("missing, unknown or revoked API token (Authorization: Bearer ...); "
            + _fix(kind))


def create_api_token(store: Store, principal: Principal, name: str,
                     expires_in: float | None, for_user: str | None = None) -> api.NewToken:
    """A new API token for the caller (or, for an admin, for `for_user`): `{id, name, token,
    user, created_at, expires_at, last_used_at}`, the token shown this once.

    Raises:
        InvalidRequest: a name or expiry out of bounds.
        Forbidden: `for_user` is someone else and the caller is no admin.
        NotFound: no such user.
    """
    name = _token_name(name)
    if expires_in is not None and not 0 < expires_in <= MAX_EXPIRY_SECONDS:
        days = MAX_EXPIRY_SECONDS // 86_400
        raise InvalidRequest(f"expires must be more than 0 s and at most {days} days")
    with store.session_scope() as s:
        user = _owner(s, principal, for_user)
        held = s.scalar(select(func.count()).select_from(ApiToken).where(
            ApiToken.user_id == user.id, ApiToken.kind == TokenKind.API,
            ApiToken.revoked_at.is_(None)))
        if held is not None and held >= MAX_API_TOKENS:
            raise Conflict(f"{user.name} holds {held} API tokens, the most there may be; "
                           "revoke some first (muster token list, muster token revoke ID)")
        expires_at = now() + expires_in if expires_in is not None else None
        row, secret = issue(s, user, TokenKind.API, name, expires_at=expires_at)
        record_event(s, entity="user", entity_id=user.id, reason=EventReason.TOKEN_CREATED,
                     actor=principal.name, message=f"token {row.id} ({name}) of {user.name}"
                     + (f", expiring in {expires_in / 86_400:g} days" if expires_in else ""))
        return api.NewToken(**token_view(row), token=secret)


def _token_name(name: str) -> str:
    name = name.strip()
    if not 0 < len(name) <= MAX_TOKEN_NAME or "\x00" in name:
        raise InvalidRequest(f"a token's name must be 1 to {MAX_TOKEN_NAME} characters "
                             "(without NUL)")
    return name


def _owner(s: Session, principal: Principal, for_user: str | None) -> User:
    """The user whose tokens the caller manages: itself, or (an admin) `for_user`."""
    if for_user is None or for_user == principal.name:
        authorize(principal, Action.OWN_ACCOUNT)
        return s.get_one(User, principal.user_id)
    authorize(principal, Action.MANAGE_USERS)
    user = s.scalar(select(User).where(User.name == for_user))
    if user is None:
        raise NotFound(f"user {for_user!r} does not exist; `muster user list` shows the users")
    return user


def list_tokens(store: Store, principal: Principal, for_user: str | None = None
                ) -> list[api.TokenView]:
    """The API tokens of the caller (or of `for_user`, for an admin) that are not revoked,
    oldest first: `{id, name, user, created_at, expires_at, last_used_at, expired}`."""
    with store.session_scope() as s:
        user = _owner(s, principal, for_user)
        rows = s.scalars(select(ApiToken).where(
            ApiToken.user_id == user.id, ApiToken.kind == TokenKind.API,
            ApiToken.revoked_at.is_(None)).order_by(ApiToken.created_at, ApiToken.id))
        return [token_view(row) for row in rows]


def revoke_token(store: Store, principal: Principal, token_id: str) -> api.TokenView:
    """Revoke an API token: the caller's own, or (an admin) anyone's. It stops working at
    once. Revoking a revoked token is harmless.

    Raises:
        NotFound: no such token, or (for a non-admin) not one of the caller's.
    """
    with store.session_scope() as s:
        row = s.get(ApiToken, token_id)
        if row is None or row.kind is not TokenKind.API or (
                row.user_id != principal.user_id and not principal.is_admin):
            raise NotFound(f"token {token_id} is not one of yours; `muster token list` shows "
                           "your tokens")
        authorize(principal, Action.OWN_ACCOUNT if row.user_id == principal.user_id
                  else Action.MANAGE_USERS)
        if row.revoked_at is None:
            row.revoked_at = now()
            ended = end_sessions(s, row.user_id, opened_with=row.id)
            record_event(s, entity="user", entity_id=row.user_id,
                         reason=EventReason.TOKEN_REVOKED, actor=principal.name,
                         message=f"token {row.id} ({row.name}) of {row.user.name}"
                         + (f"; {count(ended, 'web session')} it opened ended" if ended
                            else ""))
        return token_view(row)


def open_session(s: Session, user: User, opened_with: ApiToken | None = None,
                 address: str | None = None) -> tuple[ApiToken, str]:
    """A new web session of `user` in the caller's transaction, opened with the API token
    `opened_with` (None: a password) from `address`; it expires with that token, if sooner
    than `SESSION_SECONDS`. The user's ended sessions are deleted (a session is no record
    anyone needs once over), and past `MAX_SESSIONS` open ones the oldest ends, so logins
    cannot grow the table without bound."""
    at = now()
    sessions = list(s.scalars(select(ApiToken).where(
        ApiToken.user_id == user.id, ApiToken.kind == TokenKind.SESSION)
        .order_by(ApiToken.created_at)))
    open_ones = []
    for row in sessions:
        if row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= at):
            s.delete(row)
        else:
            open_ones.append(row)
    for row in open_ones[:max(0, len(open_ones) - MAX_SESSIONS + 1)]:
        row.revoked_at = at
    expires_at = at + SESSION_SECONDS
    if opened_with is not None and opened_with.expires_at is not None:
        expires_at = min(expires_at, opened_with.expires_at)
    row, secret = issue(s, user, TokenKind.SESSION, "web session", expires_at=expires_at)
    row.opened_with = opened_with.id if opened_with is not None else None
    row.address = address[:MAX_ADDRESS_CHARS] if address else None
    return row, secret


def end_sessions(s: Session, user_id: int, *, opened_with: str | None = None,
                 password_only: bool = False, keep: str | None = None) -> int:
    """End the open web sessions of a user in the caller's transaction: all of them, or
    those `opened_with` one API token, or (`password_only`) those a password opened; never
    `keep`. Returns how many ended."""
    query = _open_sessions(user_id)
    if opened_with is not None:
        query = query.where(ApiToken.opened_with == opened_with)
    if password_only:
        query = query.where(ApiToken.opened_with.is_(None))
    if keep is not None:
        query = query.where(ApiToken.id != keep)
    rows = list(s.scalars(query))
    at = now()
    for row in rows:
        row.revoked_at = at
    return len(rows)


def _open_sessions(user_id: int) -> Select[ApiToken]:
    at = now()
    return select(ApiToken).where(
        ApiToken.user_id == user_id, ApiToken.kind == TokenKind.SESSION,
        ApiToken.revoked_at.is_(None),
        or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > at))


def list_sessions(store: Store, principal: Principal, for_user: str | None = None
                  ) -> list[api.SessionView]:
    """The open web sessions of the caller (or of `for_user`, for an admin), oldest first:
    `session_view`s.

    Raises:
        Forbidden: `for_user` is someone else and the caller is no admin.
        NotFound: no such user.
    """
    with store.session_scope() as s:
        user = _owner(s, principal, for_user)
        rows = s.scalars(_open_sessions(user.id).order_by(ApiToken.created_at, ApiToken.id))
        return [session_view(s, row, principal) for row in rows]


def end_session(store: Store, principal: Principal, session_id: str) -> api.SessionView:
    """End a web session: the caller's own, or (an admin) anyone's. Its cookie stops
    working at once; ending an ended session is harmless.

    Raises:
        NotFound: no such session.
        Forbidden: another user's, and the caller is no admin.
    """
    with store.session_scope() as s:
        row = s.get(ApiToken, session_id)
        if row is None or row.kind is not TokenKind.SESSION:
            raise NotFound(f"web session {session_id} does not exist; `muster session list` "
                           "shows your sessions")
        if row.user_id != principal.user_id:
            authorize(principal, Action.MANAGE_USERS)
        if row.revoked_at is None:
            row.revoked_at = now()
            record_event(s, entity="user", entity_id=row.user_id,
                         reason=EventReason.SESSION_ENDED, actor=principal.name,
                         message=f"web session {row.id} of {row.user.name}")
        return session_view(s, row, principal)


def log_out(store: Store, principal: Principal) -> None:
    """Log a web session out: its cookie stops working at once."""
    if principal.token_id is None or not principal.via_session:
        return
    with store.session_scope() as s:
        row = s.get(ApiToken, principal.token_id)
        if row is not None and row.revoked_at is None:
            row.revoked_at = now()


def session_view(s: Session, row: ApiToken, principal: Principal) -> api.SessionView:
    """A web session as its list shows it: `{id, user, created_at, expires_at, last_used_at,
    address, opened_with, opened_with_name, current, ended}`."""
    token = s.get(ApiToken, row.opened_with) if row.opened_with is not None else None
    return {
        "id": row.id,
        "user": row.user.name,
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        "last_used_at": row.last_used_at,
        "address": row.address,
        "opened_with": row.opened_with,  # an API token's id; None: a password
        "opened_with_name": token.name if token is not None else None,
        "current": principal.via_session and principal.token_id == row.id,
        "ended": row.revoked_at is not None or (row.expires_at is not None
                                                 and row.expires_at <= now()),
    }


def token_view(row: ApiToken) -> api.TokenView:
    return {
        "id": row.id,
        "name": row.name,
        "user": row.user.name,
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        "last_used_at": row.last_used_at,
        "expired": row.expires_at is not None and row.expires_at <= now(),
    }
