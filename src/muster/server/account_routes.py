"""HTTP routes of accounts: password login and logout (web sessions), who am I, users, API
tokens, web sessions, and the audit trail. Thin, like `muster.server.routes`: the services
decide."""

from __future__ import annotations

import asyncio
import functools
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi import Path as InPath
from fastapi.responses import Response

from muster import api as shapes
from muster.config.units import parse_duration
from muster.errors import InvalidRequest, Unauthorized
from muster.server import api
from muster.server.auth import (
    SESSION_COOKIE,
    authenticate,
    clear_session_cookie,
    set_session_cookie,
)
from muster.server.event_feed import StreamScope
from muster.server.event_feed import stream_events as event_stream
from muster.server.follows import FollowStream
from muster.server.routes import COMMON, PREFIX, Reader, State, _errors, allow, authenticated
from muster.server.state import ServerState
from muster.services import audit, notifications, tokens, users
from muster.services.access import Action, Principal
from muster.states import Role
from muster.store import MAX_INTEGER

__all__ = ["public", "router"]

public = APIRouter(prefix=PREFIX)
router = APIRouter(prefix=PREFIX, dependencies=[Depends(authenticated)],
                   responses=_errors(*COMMON))
Account = Annotated[Principal, Depends(allow(Action.OWN_ACCOUNT))]
Admin = Annotated[Principal, Depends(allow(Action.MANAGE_USERS))]
NamePath = Annotated[str, InPath(min_length=1, max_length=32, pattern=r"^[a-z_][a-z0-9_.-]*$",
                                 description="a user's name")]
TokenIdPath = Annotated[str, InPath(pattern=r"^[0-9a-f]{16}$",
                                    description="a token's id (`muster token list`)")]
SessionIdPath = Annotated[str, InPath(pattern=r"^[0-9a-f]{16}$",
                                      description="a web session's id (`muster session list`)")]
UserQuery = Annotated[str | None, Query(min_length=1, max_length=32, description=(
    "an admin names another user"))]


@public.post("/login", response_model=api.LoginView,
             responses=_errors(400, 401, 413, 422, 429))
async def log_in(state: State, request: Request, response: Response, body: api.LoginRequest
                 ) -> shapes.LoginView:
    """Check a user's password (`name`, `password`), or an API token of theirs (`token`),
    and open a web session: the `muster_session` cookie (HttpOnly, SameSite=Strict; Secure
    over TLS) and its CSRF token, which every unsafe request of the session sends as
    `X-CSRF-Token`. Failed logins are slowed per address and user name, and per address
    (429 with Retry-After); a session opened with a token ends with that token."""
    login = await open_session(state, client_address(request), body.name, body.password,
                               body.token)
    set_session_cookie(response, request, login.secret)
    view = await asyncio.to_thread(users.whoami, state.store, login.principal,
                                   tokens.csrf_token(login.secret))
    return shapes.LoginView(**view, expires_at=login.expires_at)


def client_address(request: Request) -> str:
    """The client's address: the peer's, or, from a proxy in the cluster config's
    `trusted_proxies`, the one its X-Forwarded-For names (`muster.server.app`)."""
    return request.client.host if request.client else "unknown"


async def open_session(state: ServerState, address: str, name: str | None,
                       password: str | None, token: str | None) -> users.Login:
    """A password or token login, counted against guessing (`LoginLimiter`); what the API's
    and the UI's login share.

    Raises:
        InvalidRequest: neither a name and password nor a token.
        Unauthorized: they do not work.
        TooManyRequests: too many failures lately.
    """
    if token:
        key, attempt = None, functools.partial(users.log_in_with_token, state.store, token,
                                               address)
    elif name and password:
        key, attempt = name, functools.partial(users.log_in, state.store, name, password,
                                               address)
    else:
        raise InvalidRequest("log in with `name` and `password`, or with a `token`")
    counted = state.logins.begin(key, address)
    try:
        login = await asyncio.to_thread(attempt)
    except Unauthorized:
        counted.failed()
        raise
    except BaseException:
        counted.forgive()  # no verdict: the server was busy, or broke
        raise
    counted.succeeded()
    return login


@router.post("/logout", status_code=204, response_class=Response)
def log_out(state: State, request: Request, who: Account) -> Response:
    """End the web session the request comes with (its cookie stops working at once) and
    clear the cookie; with an API token, nothing to end (`muster token revoke` ends one)."""
    tokens.log_out(state.store, who)
    state.follows.recheck(who.name)
    response = Response(status_code=204)
    clear_session_cookie(response, request)
    return response


@router.get("/whoami", response_model=api.Whoami)
def whoami(state: State, request: Request, who: Reader) -> shapes.Whoami:
    """The caller: name, role, the credential it came with, and a web session's CSRF token."""
    cookie = request.cookies.get(SESSION_COOKIE) if who.via_session else None
    return users.whoami(state.store, who, tokens.csrf_token(cookie) if cookie else None)


@router.get("/users", response_model=api.many(api.UserView))
def list_users(state: State, _: Reader) -> list[shapes.UserView]:
    """Every user, oldest first (deactivated ones too)."""
    return users.list_users(state.store)


@router.post("/users", status_code=201, response_model=api.NewUser,
             responses=_errors(400, 409))
def create_user(state: State, body: api.UserCreateRequest, who: Admin) -> shapes.NewUser:
    """A new user (admins only) and their first API token, shown this once."""
    return users.create_user(state.store, who, body.name, Role(body.role),
                             display_name=body.display_name, password=body.password,
                             unix_user=body.unix_user)


@router.get("/users/{name}", response_model=api.UserView, responses=_errors(404))
def get_user(state: State, _: Reader, name: NamePath) -> shapes.UserView:
    return users.get_user(state.store, name)


@router.patch("/users/{name}", response_model=api.UserView, responses=_errors(400, 404, 409))
def edit_user(state: State, name: NamePath, body: api.UserEditRequest, who: Account
              ) -> shapes.UserView:
    """Change your own display name or password (with your current one), or, as an admin,
    anything of anyone: role, Unix account, password. The last active admin keeps the role."""
    change = users.UserChange(
        display_name=body.display_name, role=Role(body.role) if body.role else None,
        password=body.password, current_password=body.current_password,
        unix_user=body.unix_user)
    view = users.edit_user(state.store, who, name, change)
    if change.password is not None:
        state.follows.recheck(name)  # the sessions the old password opened ended
    return view


@router.post("/users/{name}/deactivate", response_model=api.UserView,
             responses=_errors(404, 409))
def deactivate_user(state: State, name: NamePath, who: Admin) -> shapes.UserView:
    """Deactivate a user: their sessions end and their tokens stop working with the next
    request, and their log follows end; their experiments keep running and stay visible."""
    view = users.deactivate_user(state.store, who, name)
    state.follows.recheck(name)
    return view


@router.post("/users/{name}/activate", response_model=api.UserView, responses=_errors(404))
def activate_user(state: State, name: NamePath, who: Admin) -> shapes.UserView:
    return users.activate_user(state.store, who, name)


@router.get("/tokens", response_model=api.many(api.TokenView), responses=_errors(404))
def list_tokens(state: State, who: Account,
                user: Annotated[str | None, Query(min_length=1, max_length=32, description=(
                    "an admin lists this user's tokens"))] = None) -> list[shapes.TokenView]:
    """Your API tokens that are not revoked (an admin: `user`'s), oldest first; never the
    tokens themselves."""
    return tokens.list_tokens(state.store, who, user)


@router.post("/tokens", status_code=201, response_model=api.NewToken,
             responses=_errors(400, 404, 409))
def create_token(state: State, body: api.TokenCreateRequest, who: Account) -> shapes.NewToken:
    """A new API token for you (an admin: for `user`), shown this once; `expires` a
    duration (30d), none for never."""
    try:
        expires_in = parse_duration(body.expires) if body.expires is not None else None
    except ValueError as exc:
        raise InvalidRequest(f"expires: {exc}") from exc
    return tokens.create_api_token(state.store, who, body.name, expires_in, body.user)


@router.delete("/tokens/{token_id}", response_model=api.TokenView, responses=_errors(404))
def revoke_token(state: State, token_id: TokenIdPath, who: Account) -> shapes.TokenView:
    """Revoke one of your API tokens (an admin: anyone's); it stops working at once, and so
    do the web sessions it opened and the log follows of either."""
    view = tokens.revoke_token(state.store, who, token_id)
    state.follows.recheck(view["user"])
    return view


@router.get("/sessions", response_model=api.many(api.SessionView), responses=_errors(404))
def list_sessions(state: State, who: Account, user: UserQuery = None) -> list[shapes.SessionView]:
    """Your open web sessions (an admin: `user`'s), oldest first: where each was opened
    from, with which API token (none: a password), and which one is this request's."""
    return tokens.list_sessions(state.store, who, user)


@router.delete("/sessions/{session_id}", response_model=api.SessionView,
               responses=_errors(404))
def end_session(state: State, session_id: SessionIdPath, who: Account) -> shapes.SessionView:
    """End one of your web sessions (an admin: anyone's); its cookie stops working at once,
    and so do its log follows."""
    view = tokens.end_session(state.store, who, session_id)
    state.follows.recheck(view["user"])
    return view


@router.get("/notifications", response_model=api.many(api.NotificationSubscriptionView))
def list_notification_subscriptions(
    state: State, who: Account,
    everyone: Annotated[bool, Query(alias="all", description=(
        "an admin lists every user's"))] = False,
) -> list[shapes.NotificationSubscriptionView]:
    """Your notification subscriptions (an admin with `all`: everyone's), oldest first;
    their URLs redacted to scheme and host."""
    return notifications.list_subscriptions(state.store, who, everyone)


@router.post("/notifications", status_code=201, response_model=api.NewNotificationSubscription,
             responses=_errors(400, 409))
def add_notification_subscription(state: State, body: api.NotificationRequest, who: Account
                                  ) -> shapes.NewNotificationSubscription:
    """Be told of `events` of your own experiments and models (an admin: also the disk guard
    and quarantined nodes) at `url`: https://… is muster's signed webhook (its signing key
    is in the answer, this once), anything else an Apprise URL."""
    return notifications.add_subscription(
        state.store, who, body.url, body.events,
        allowed_hosts=state.platform.settings.notification_hosts)


@router.delete("/notifications/{subscription_id}",
               response_model=api.NotificationSubscriptionView, responses=_errors(404))
def remove_notification_subscription(
    state: State, who: Account,
    subscription_id: Annotated[int, InPath(ge=1, le=MAX_INTEGER)],
) -> shapes.NotificationSubscriptionView:
    """Remove one of your subscriptions (an admin: anyone's); what it has not delivered yet
    fails."""
    return notifications.remove_subscription(state.store, who, subscription_id)


@router.get("/notifications/log", response_model=api.many(api.NotificationView))
def list_notification_log(
    state: State, who: Account,
    limit: Annotated[int, Query(ge=1, le=notifications.MAX_LOG)] = notifications.DEFAULT_LOG,
) -> list[shapes.NotificationView]:
    """The latest notifications, newest first, and how their delivery went: of your
    subscriptions (an admin: all, the cluster config's too)."""
    return notifications.list_notifications(state.store, who,
                                            state.platform.settings.notifications, limit)


@router.get("/events", response_model=api.many(api.AuditEvent), responses=_errors(404))
def list_events(
    state: State, _: Reader,
    experiment_id: Annotated[int | None, Query(ge=1, le=MAX_INTEGER)] = None,
    trial_id: Annotated[int | None, Query(ge=1, le=MAX_INTEGER)] = None,
    user: Annotated[str | None, Query(min_length=1, max_length=64, description=(
        "only what this actor did: a user's name, or system:supervisor, ..."))] = None,
    kind: Annotated[str | None, Query(min_length=1, max_length=64, description=(
        "only events of this kind (their `kind`: created, killed, OOM, ...)"))] = None,
    after_id: Annotated[int | None, Query(ge=0, le=MAX_INTEGER)] = None,
    before_id: Annotated[int | None, Query(ge=1, le=MAX_INTEGER, description=(
        "with `tail`: the last `tail` events before this one (the page before)"))] = None,
    limit: Annotated[int, Query(ge=1, le=audit.MAX_LIMIT)] = audit.DEFAULT_LIMIT,
    tail: Annotated[int | None, Query(ge=1, le=audit.MAX_LIMIT)] = None,
) -> list[shapes.AuditEvent]:
    """The audit trail, oldest first: who did what (`actor`: a user, or `system:...`),
    of an experiment, a trial, an actor or a kind; `limit` events after `after_id`, or the
    last `tail` (before `before_id`)."""
    return audit.list_events(state.store, experiment_id=experiment_id, trial_id=trial_id,
                             actor=user, kind=kind, after_id=after_id, before_id=before_id,
                             limit=limit, tail=tail)


@router.get("/events/stream", response_class=Response, responses={
    **_errors(404, 429), 200: {"content": {"text/event-stream": {"schema": {
        "type": "string", "description": "`event:`, `id:` and `data:` lines (JSON data)"}}},
        "description": (
        "server-sent events: `ready`, then each event as `muster` (its id as the "
        "message's id), `reset` when too far behind")}})
async def stream_events(
    state: State, request: Request, who: Reader,
    experiment_id: Annotated[int | None, Query(ge=1, le=MAX_INTEGER)] = None,
    trial_id: Annotated[int | None, Query(ge=1, le=MAX_INTEGER)] = None,
    after_id: Annotated[int | None, Query(ge=0, le=MAX_INTEGER, description=(
        "resume after this event (a reconnecting EventSource's Last-Event-ID wins)"))] = None,
    last_event_id: Annotated[str | None, Header(max_length=20, include_in_schema=False)] = None,
) -> Response:
    """The events of an experiment, a trial or (neither) the whole server as they are
    recorded (`muster.server.event_feed`): what keeps the web UI's pages live. Counts as
    one of the caller's follows, and ends when its credential stops working."""
    scope = StreamScope(experiment_id, trial_id)
    await asyncio.to_thread(audit.list_events, state.store, experiment_id=experiment_id,
                            trial_id=trial_id, limit=1)  # a 404 now, not in the stream
    point = _event_id(last_event_id) if last_event_id else after_id
    ticket = state.follows.take(who.name)
    return FollowStream(
        event_stream(state.store, state.feed, scope, point), ticket,
        recheck_s=state.follows.recheck_s,
        recheck=functools.partial(authenticate, request, state.store, csrf=False),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _event_id(text: str) -> int:
    """A `Last-Event-ID` header: an event id.

    Raises:
        InvalidRequest: it is not one.
    """
    if not text.isdigit() or int(text) > MAX_INTEGER:
        raise InvalidRequest(f"Last-Event-ID must be an event id (a whole number), got "
                             f"{text!r}; leave it out to start from the newest event")
    return int(text)
