"""Users: the first admin and the home's token, made at start; create, list, change,
deactivate and activate users; password logins that open web sessions.

The single-user flow needs no step of its own: the first server to meet a database makes
the user `admin` and writes an API token of theirs to `$MUSTER_HOME/secrets/token` (0600),
which the CLI on that machine reads, as before users existed. A token file from before
users is adopted (the same token keeps working); a file that is missing, or whose token was
revoked, gets a new admin token at the next start: whoever runs the server is its admin.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from muster import api
from muster.atomic import atomic_write_bytes
from muster.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from muster.services import tokens
from muster.services.access import Action, Principal, authorize
from muster.services.passwords import check_strength, hash_password, matches
from muster.states import EventReason, Role, TokenKind
from muster.store import ApiToken, Experiment, Store, User, record_event
from muster.store.actors import SERVER
from muster.store.models import now
from muster.words import count

__all__ = ["FIRST_ADMIN", "NAME_PATTERN", "UserChange", "activate_user", "bootstrap",
           "create_user", "deactivate_user", "edit_user", "list_users", "log_in",
           "log_in_with_token", "principal",
           "user_view", "whoami"]

log = logging.getLogger(__name__)

FIRST_ADMIN = "admin"
HOME_TOKEN_NAME = "home token"
# Unix-like: no colon (`system:...` is muster's), no upper case, no spaces.
NAME_PATTERN = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
UNIX_NAME_PATTERN = re.compile(r"[a-z_][a-z0-9_-]{0,30}\$?")
MAX_DISPLAY_NAME = 200


def bootstrap(store: Store, token_path: Path) -> str:
    """Make the first admin if the database has no user (giving them every experiment that
    has no owner), and make sure `token_path` holds a working API token of an active admin.
    Returns the name of that admin."""
    held = _read_token_file(token_path)
    with store.session_scope() as s:
        _first_admin(s)
        admin = s.scalar(select(User).where(User.role == Role.ADMIN,
                                            User.active.is_(True)).order_by(User.id))
        if admin is None:
            raise Conflict("the database has users but no active admin; activate one with "
                           "SQL (UPDATE users SET active = true WHERE name = '...')")
        if held is not None and _works(s, held):
            return admin.name
        adopt = held if held is not None and _unknown(s, held) else None
        _, secret = tokens.issue(s, admin, TokenKind.API, HOME_TOKEN_NAME,
                                 secret=adopt)
        record_event(s, entity="user", entity_id=admin.id, reason=EventReason.TOKEN_CREATED,
                     actor=SERVER, message=f"the home token of {admin.name}, in {token_path}"
                     + (" (adopted)" if adopt else ""))
        if adopt is None:
            atomic_write_bytes(token_path, secret.encode() + b"\n", mode=0o600)
        return admin.name


def _read_token_file(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text if 0 < len(text) <= tokens.MAX_TOKEN_CHARS else None


def _first_admin(s: Session) -> None:
    if s.scalar(select(User.id).limit(1)) is not None:
        return
    admin = User(name=FIRST_ADMIN, display_name="muster admin", role=Role.ADMIN)
    s.add(admin)
    s.flush()
    adopted = cast(CursorResult[Any], s.execute(  # an UPDATE's result: it has a rowcount
        update(Experiment).where(Experiment.owner_id.is_(None)).values(owner_id=admin.id)
    )).rowcount
    record_event(s, entity="user", entity_id=admin.id, reason=EventReason.USER_CREATED,
                 actor=SERVER, message=f"{admin.name} created with role admin, the first user"
                 + (f"; owner of the {adopted} experiments made before users" if adopted
                    else ""))


def _works(s: Session, secret: str) -> bool:
    row = s.scalar(select(ApiToken).where(ApiToken.secret_hash == tokens.hash_secret(secret)))
    return (row is not None and row.revoked_at is None and row.kind is TokenKind.API
            and (row.expires_at is None or row.expires_at > now())
            and row.user.active and row.user.role is Role.ADMIN)


def _unknown(s: Session, secret: str) -> bool:
    return s.scalar(select(ApiToken.id).where(
        ApiToken.secret_hash == tokens.hash_secret(secret))) is None


def principal(store: Store, name: str) -> Principal:
    """The principal of user `name`, for code that acts as a user without a request (tests,
    benchmarks, scripts on the server's machine).

    Raises:
        NotFound: there is no such user.
    """
    with store.session_scope() as s:
        user = user_or_404(s, name)
        return Principal(user_id=user.id, name=user.name, role=user.role)


def user_view(user: User) -> api.UserView:
    return {
        "name": user.name,
        "display_name": user.display_name,
        "role": user.role,
        "active": user.active,
        "has_password": user.password_hash is not None,
        "unix_user": user.unix_user,
        "created_at": user.created_at,
        "last_seen_at": user.last_seen_at,
    }


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidRequest(f"user name {name!r} must be 1 to 32 characters of a-z, 0-9, "
                             "'_', '.' and '-', starting with a letter or '_'")
    return name


def _check_display_name(text: str) -> str:
    text = text.strip()
    if len(text) > MAX_DISPLAY_NAME or any(ord(c) < 32 for c in text):
        raise InvalidRequest(f"a display name must be at most {MAX_DISPLAY_NAME} characters "
                             "without control characters")
    return text


def _check_unix_user(name: str | None) -> str | None:
    if name is None or name == "":
        return None
    if not UNIX_NAME_PATTERN.fullmatch(name):
        raise InvalidRequest(f"unix_user {name!r} is not a Unix account name (a-z, 0-9, '_', "
                             "'-', at most 32 characters)")
    return name


def create_user(store: Store, principal: Principal, name: str, role: Role, *,
                display_name: str = "", password: str | None = None,
                unix_user: str | None = None) -> api.NewUser:
    """A new user and their first API token: the user's view plus `token` (shown once).

    Raises:
        Forbidden: the caller is no admin.
        Conflict: the name is taken.
        InvalidRequest: a bad name, display name, password or Unix account name.
    """
    authorize(principal, Action.MANAGE_USERS)
    check_name(name)
    display_name = _check_display_name(display_name)
    unix_user = _check_unix_user(unix_user)
    _check_free(store, name)  # before the (slow) hash
    password_hash = hash_password(password) if password is not None else None
    with store.session_scope() as s:
        _check_free(s, name)
        user = User(name=name, display_name=display_name, role=role,
                    password_hash=password_hash, unix_user=unix_user)
        s.add(user)
        s.flush()
        record_event(s, entity="user", entity_id=user.id, reason=EventReason.USER_CREATED,
                     actor=principal.name, message=f"{name} created with role {role}")
        row, secret = tokens.issue(s, user, TokenKind.API, "first token")
        record_event(s, entity="user", entity_id=user.id, reason=EventReason.TOKEN_CREATED,
                     actor=principal.name, message=f"token {row.id} (first token) of {name}")
        return api.NewUser(**user_view(user), token=secret, token_id=row.id)


def _check_free(where: Store | Session, name: str) -> None:
    if isinstance(where, Store):
        with where.session_scope() as s:
            _check_free(s, name)
        return
    if where.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"user {name} exists already; `muster user list` shows the users")


def list_users(store: Store) -> list[api.UserView]:
    with store.session_scope() as s:
        return [user_view(u) for u in s.scalars(select(User).order_by(User.id))]


def get_user(store: Store, name: str) -> api.UserView:
    with store.session_scope() as s:
        return user_view(user_or_404(s, name))


def user_or_404(s: Session, name: str) -> User:
    user = s.scalar(select(User).where(User.name == name))
    if user is None:
        raise NotFound(f"user {name!r} does not exist; `muster user list` shows the users")
    return user


@dataclass(frozen=True)
class UserChange:
    """What `edit_user` changes; None leaves a field as it is (`unix_user` "" clears it)."""

    display_name: str | None = None
    role: Role | None = None
    password: str | None = None
    current_password: str | None = None  # a user changing its own password says the old
    unix_user: str | None = None

    def needs_admin(self) -> bool:
        return self.role is not None or self.unix_user is not None


def edit_user(store: Store, principal: Principal, name: str, change: UserChange
              ) -> api.UserView:
    """Change a user: one's own display name and password (with the current one, if set),
    or, for an admin, anything of anyone.

    Raises:
        Forbidden: not the caller's own account and not an admin; the last active admin
            would lose the role; a wrong current password.
    """
    own = name == principal.name
    authorize(principal, Action.MANAGE_USERS if change.needs_admin() or not own
              else Action.OWN_ACCOUNT)
    display_name = (_check_display_name(change.display_name)
                    if change.display_name is not None else None)
    unix_user = _check_unix_user(change.unix_user)
    password_hash = None
    if change.password is not None:  # checked first, then the (slow) hashes
        check_strength(change.password)
        get_user(store, name)
        if own:
            _check_current_password(store, principal, change.current_password)
        password_hash = hash_password(change.password)
    with store.session_scope() as s:
        user = user_or_404(s, name)
        words = _apply(s, user, change, display_name, unix_user, password_hash)
        if password_hash is not None:
            # A password login proves the old password, so its sessions end with it (but
            # not the session that changed it); a token's sessions follow the token.
            ended = tokens.end_sessions(s, user.id, password_only=True,
                                        keep=principal.token_id if own else None)
            words += [f"{count(ended, 'web session')} ended"] if ended else []
        if words:
            user.updated_at = now()
            record_event(s, entity="user", entity_id=user.id, reason=EventReason.USER_CHANGED,
                         actor=principal.name, message=f"{name}: {', '.join(words)}")
        return user_view(user)


def _apply(s: Session, user: User, change: UserChange, display_name: str | None,
           unix_user: str | None, password_hash: str | None) -> list[str]:
    """Make the change on `user`; returns what changed, in words, for the event."""
    words = []
    if display_name is not None and display_name != user.display_name:
        user.display_name = display_name
        words.append(f"display name {display_name!r}")
    if change.role is not None and change.role is not user.role:
        if user.role is Role.ADMIN:
            _keep_an_admin(s, user, "lose the admin role")
        words.append(f"role {user.role} → {change.role}")
        user.role = change.role
    if change.unix_user is not None and unix_user != user.unix_user:
        user.unix_user = unix_user
        words.append(f"Unix account {unix_user or '(its name)'}")
    if password_hash is not None:
        user.password_hash = password_hash
        words.append("password set")
    return words


def _check_current_password(store: Store, principal: Principal, current: str | None
                            ) -> None:
    with store.session_scope() as s:
        stored = s.get_one(User, principal.user_id).password_hash
    if stored is None:
        return
    if not current:
        raise Forbidden("to change your password, give your current one too "
                        "(current_password); an admin can set it for you")
    if not matches(current, stored):
        raise Forbidden("current_password is not your current password; give the one you "
                        "log in with (an admin can set a new one for you)")


def _keep_an_admin(s: Session, user: User, losing: str) -> None:
    others = s.scalar(select(User.id).where(User.role == Role.ADMIN,
                                            User.active.is_(True), User.id != user.id).limit(1))
    if others is None:
        raise Conflict(f"{user.name} is the only active admin and cannot {losing}; make "
                       "another admin first (muster user edit NAME --role admin)")


def deactivate_user(store: Store, principal: Principal, name: str) -> api.UserView:
    """Deactivate a user: their web sessions end and their API tokens stop working with
    the next request; their experiments keep running and stay visible. Harmless when already
    inactive.

    Raises:
        Forbidden: the caller is no admin, or deactivates itself.
        Conflict: they are the last active admin.
    """
    authorize(principal, Action.MANAGE_USERS)
    if name == principal.name:
        raise Forbidden("you cannot deactivate yourself; another admin can")
    with store.session_scope() as s:
        user = user_or_404(s, name)
        if user.active:
            if user.role is Role.ADMIN:
                _keep_an_admin(s, user, "be deactivated")
            user.active, user.updated_at = False, now()
            ended = tokens.end_sessions(s, user.id)
            record_event(s, entity="user", entity_id=user.id,
                         reason=EventReason.USER_DEACTIVATED, actor=principal.name,
                         message=f"{name} deactivated; their tokens no longer work"
                         + (f" and {count(ended, 'web session')} of theirs ended" if ended
                            else ""))
        return user_view(user)


def activate_user(store: Store, principal: Principal, name: str) -> api.UserView:
    """Let a deactivated user in again (their tokens that were not revoked work again)."""
    authorize(principal, Action.MANAGE_USERS)
    with store.session_scope() as s:
        user = user_or_404(s, name)
        if not user.active:
            user.active, user.updated_at = True, now()
            record_event(s, entity="user", entity_id=user.id,
                         reason=EventReason.USER_ACTIVATED, actor=principal.name,
                         message=f"{name} activated")
        return user_view(user)


@dataclass(frozen=True)
class Login:
    """A web session opened by a password login."""

    principal: Principal
    secret: str  # the cookie's value
    expires_at: float


def log_in(store: Store, name: str, password: str, address: str | None = None) -> Login:
    """Check a password and open a web session (from `address`, which its list shows).

    Raises:
        Unauthorized: no such user, no password set, or a wrong one (the same words for
            each, in about the same time); or a deactivated user with the right password.
    """
    with store.session_scope() as s:
        user = s.scalar(select(User).where(User.name == name)) if NAME_PATTERN.fullmatch(
            name) else None
        stored = user.password_hash if user is not None else None
    if not matches(password, stored) or user is None:
        raise Unauthorized("wrong user name or password")
    with store.session_scope() as s:
        user = s.get_one(User, user.id)
        if not user.active:
            raise Unauthorized(f"user {name} is deactivated; an admin can activate them "
                               f"again (muster user activate {name})")
        row, secret = tokens.open_session(s, user, address=address)
        expires_at = row.expires_at or 0.0
        user.last_seen_at = now()
        record_event(s, entity="user", entity_id=user.id, reason=EventReason.LOGGED_IN,
                     actor=user.name, message=f"web session {row.id} opened"
                     + (f" from {row.address}" if row.address else ""))
        return Login(Principal(user_id=user.id, name=user.name, role=user.role,
                               token_id=row.id, via_session=True), secret, expires_at)


def log_in_with_token(store: Store, token: str, address: str | None = None) -> Login:
    """Open a web session for the user of an API token (the UI's "Token" login), from
    `address`; the session ends when that token is revoked or expires.

    Raises:
        Unauthorized: the token does not work (unknown, revoked, expired, deactivated).
    """
    user = tokens.authenticate(store, token, TokenKind.API)
    with store.session_scope() as s:
        row, secret = tokens.open_session(s, s.get_one(User, user.user_id),
                                          opened_with=s.get(ApiToken, user.token_id),
                                          address=address)
        record_event(s, entity="user", entity_id=user.user_id, reason=EventReason.LOGGED_IN,
                     actor=user.name, message=f"web session {row.id} opened with token "
                                              f"{user.token_id}"
                     + (f" from {row.address}" if row.address else ""))
        return Login(Principal(user_id=user.user_id, name=user.name, role=user.role,
                               token_id=row.id, via_session=True), secret,
                     row.expires_at or 0.0)


def whoami(store: Store, principal: Principal, csrf_token: str | None) -> api.Whoami:
    """The caller's own account, the credential it came with, and its web session's
    `csrf_token` (None with an API token; `tokens.csrf_token` makes it from the cookie)."""
    with store.session_scope() as s:
        view = user_view(s.get_one(User, principal.user_id))
    return api.Whoami(**view, via="session" if principal.via_session else "token",
                      token_id=principal.token_id, csrf_token=csrf_token)
