"""The web UI's account pages: your password, web sessions and API tokens (`/account`), and
the users of the server (`/users`: everyone may read it, admins change it).

Every form is a plain one with the session's CSRF token, no script. Each action calls the
same service as its API route (named in its docstring), with the browser's principal. A
done action goes back to its page (303: a reload never repeats it), with a notice named
by a word of `NOTICES` (the URL never carries text onto the page); a refused one shows the
page again with the service's sentence and its 4xx status, the form's fields kept but no
password. A new token, yours or a new user's first, is shown once on the answer to the form
that made it (`Cache-Control: no-store`), as `muster token create` prints it once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi import Path as FastApiPath
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from muster.config.units import parse_duration
from muster.errors import InvalidRequest, MusterError
from muster.server.account_routes import NamePath, SessionIdPath, TokenIdPath
from muster.server.auth import SESSION_COOKIE
from muster.server.pages import Visitor, check_form_csrf, render, server_state, to_login
from muster.services import notifications, quotas, tokens, users
from muster.services.access import Principal
from muster.states import NotificationKind, Role
from muster.store import MAX_INTEGER

__all__ = ["NOTICES", "account_pages"]

account_pages = APIRouter(include_in_schema=False)

# What a done action says on the page it returns to: `?done=WORD` names one of these.
NOTICES = {
    "password": "Your password changed. The web sessions it had opened elsewhere ended; "
                "this one and your API tokens go on.",
    "session": "The session ended.",
    "revoked": "The token was revoked: it stops working at once, and so do the web "
               "sessions it opened.",
    "role": "The role changed; it applies from the user's next request.",
    "deactivated": "The user was deactivated: their sessions ended and their tokens stop "
                   "working; their experiments keep running.",
    "activated": "The user can log in again; their tokens that were not revoked work again.",
    "unsubscribed": "The notification was removed; what it had not delivered yet is not sent.",
}
NOTIFICATIONS_SHOWN = 20  # the latest of your notifications the account page lists
SubscriptionIdPath = Annotated[int, FastApiPath(ge=1, le=MAX_INTEGER)]
Done = Annotated[str | None, Query(max_length=16)]
# A form field longer than this is refused before any service sees it (the services bound
# each field more tightly: a password 1,024 characters, a name 32).
MAX_FIELD_CHARS = 2048


# -- your account --------------------------------------------------------------------------

@account_pages.get("/account", response_class=HTMLResponse)
def account_page(request: Request, who: Visitor, done: Done = None) -> Response:
    """Your quotas and what is in use of them (`GET /api/v1/quotas/users/{you}`), your
    password, open web sessions and API tokens (`GET /api/v1/sessions` and `/tokens`), each
    session and token with a button that ends it, and your notifications with their latest
    deliveries (`GET /api/v1/notifications` and `/notifications/log`)."""
    if who is None:
        return to_login(request)
    return _account(request, who, notice=NOTICES.get(done or ""))


def _account(request: Request, who: Principal, status: int = 200, **context: Any
             ) -> HTMLResponse:
    state = server_state(request)
    store = state.store
    return render(request, "account.html", who, status=status, nav="account",
                  quota=quotas.user_quotas(store, state.platform.quotas, who.name),
                  sessions=tokens.list_sessions(store, who),
                  api_tokens=tokens.list_tokens(store, who),
                  subscriptions=notifications.list_subscriptions(store, who),
                  notification_log=notifications.list_notifications(
                      store, who, state.platform.settings.notifications, NOTIFICATIONS_SHOWN),
                  notification_kinds=[k.value for k in NotificationKind], **context)


@account_pages.post("/account/password", response_class=HTMLResponse)
async def change_password(request: Request, who: Visitor) -> Response:
    """Change your password with your current one (`PATCH /api/v1/users/{you}`): the web
    sessions the old one opened end, but not this one."""
    if who is None:
        return to_login(request)
    form = await _form(request, who)
    if form.get("password") != form.get("repeat"):
        return _account(request, who, status=400, password_problem=(
            "The new password and its repeat differ; type the same one twice."))
    change = users.UserChange(password=form.get("password", ""),
                              current_password=form.get("current_password", ""))
    try:
        await asyncio.to_thread(users.edit_user, server_state(request).store, who, who.name,
                                change)
    except MusterError as exc:
        return _account(request, who, status=_client_status(exc), password_problem=str(exc))
    server_state(request).follows.recheck(who.name)
    return _back("/account", "password")


@account_pages.post("/account/tokens", response_class=HTMLResponse)
async def create_token(request: Request, who: Visitor) -> Response:
    """A new API token of yours (`POST /api/v1/tokens`), shown on the answer this once."""
    if who is None:
        return to_login(request)
    form = await _form(request, who)
    name, expires = form.get("name", "").strip(), form.get("expires", "").strip()
    try:
        expires_in = _duration(expires)
        made = await asyncio.to_thread(tokens.create_api_token, server_state(request).store,
                                       who, name, expires_in)
    except MusterError as exc:
        return _account(request, who, status=_client_status(exc), token_problem=str(exc),
                        token_form={"name": name, "expires": expires})
    return _shown_once(_account(request, who, status=201, new_token=made))


@account_pages.post("/account/notifications", response_class=HTMLResponse)
async def add_notification(request: Request, who: Visitor) -> Response:
    """A new notification subscription of yours (`POST /api/v1/notifications`); a webhook's
    signing key is shown on the answer this once."""
    if who is None:
        return to_login(request)
    form = await request.form()
    fields = await _form(request, who)
    target = fields.get("url", "").strip()
    chosen = [str(v) for v in form.getlist("events")]
    state = server_state(request)
    try:
        made = await asyncio.to_thread(
            notifications.add_subscription, state.store, who, target, chosen or None,
            allowed_hosts=state.platform.settings.notification_hosts)
    except MusterError as exc:
        return _account(request, who, status=_client_status(exc), notify_problem=str(exc),
                        notify_form={"url": target, "events": chosen})
    return _shown_once(_account(request, who, status=201, new_subscription=made))


@account_pages.post("/account/notifications/{subscription_id}/remove")
async def remove_notification(request: Request, who: Visitor,
                              subscription_id: SubscriptionIdPath) -> Response:
    """The "Remove" button of a subscription (`DELETE /api/v1/notifications/{id}`)."""
    return await _action(request, who, functools.partial(
        notifications.remove_subscription, server_state(request).store,
        subscription_id=subscription_id), "/account", "unsubscribed")


@account_pages.post("/account/sessions/{session_id}/end")
async def end_session(request: Request, who: Visitor, session_id: SessionIdPath) -> Response:
    """The "End" button of a session (`DELETE /api/v1/sessions/{id}`)."""
    return await _action(request, who, functools.partial(
        tokens.end_session, server_state(request).store, session_id=session_id),
        "/account", "session")


@account_pages.post("/account/tokens/{token_id}/revoke")
async def revoke_token(request: Request, who: Visitor, token_id: TokenIdPath) -> Response:
    """The "Revoke" button of an API token (`DELETE /api/v1/tokens/{id}`)."""
    return await _action(request, who, functools.partial(
        tokens.revoke_token, server_state(request).store, token_id=token_id),
        "/account", "revoked")


# -- the users of the server ---------------------------------------------------------------

@account_pages.get("/users", response_class=HTMLResponse)
def users_page(request: Request, who: Visitor, done: Done = None) -> Response:
    """Every user (`GET /api/v1/users`); for an admin, a form that makes one and, on each
    row, its role and a button that deactivates or activates it."""
    if who is None:
        return to_login(request)
    return _users(request, who, notice=NOTICES.get(done or ""))


def _users(request: Request, who: Principal, status: int = 200, **context: Any
           ) -> HTMLResponse:
    return render(request, "users.html", who, status=status, nav="users",
                  users=users.list_users(server_state(request).store),
                  roles=[role.value for role in Role], **context)


@account_pages.post("/users", response_class=HTMLResponse)
async def create_user(request: Request, who: Visitor) -> Response:
    """A new user and their first API token (`POST /api/v1/users`, admins only), the token
    shown on the answer this once."""
    if who is None:
        return to_login(request)
    form = await _form(request, who)
    name, role = form.get("name", "").strip(), form.get("role", "")
    display_name, password = form.get("display_name", "").strip(), form.get("password", "")
    kept = {"name": name, "role": role, "display_name": display_name}
    try:
        made = await asyncio.to_thread(
            users.create_user, server_state(request).store, who, name, _role(role),
            display_name=display_name, password=password or None)
    except MusterError as exc:
        return _users(request, who, status=_client_status(exc), user_problem=str(exc),
                      user_form=kept)
    return _shown_once(_users(request, who, status=201, new_user=made))


@account_pages.post("/users/{name}/role", response_class=HTMLResponse)
async def change_role(request: Request, who: Visitor, name: NamePath) -> Response:
    """Give a user another role (`PATCH /api/v1/users/{name}`, admins only)."""
    if who is None:
        return to_login(request)
    form = await _form(request, who)
    try:
        change = users.UserChange(role=_role(form.get("role", "")))
    except InvalidRequest as exc:
        return _users(request, who, status=exc.http_status, problem=str(exc))
    return await _action(request, who, functools.partial(
        users.edit_user, server_state(request).store, name=name, change=change),
        "/users", "role", form=form)


@account_pages.post("/users/{name}/deactivate", response_class=HTMLResponse)
async def deactivate_user(request: Request, who: Visitor, name: NamePath) -> Response:
    """Deactivate a user (`POST /api/v1/users/{name}/deactivate`, admins only)."""
    return await _action(request, who, functools.partial(
        users.deactivate_user, server_state(request).store, name=name),
        "/users", "deactivated", recheck=name)


@account_pages.post("/users/{name}/activate", response_class=HTMLResponse)
async def activate_user(request: Request, who: Visitor, name: NamePath) -> Response:
    """Let a deactivated user in again (`POST /api/v1/users/{name}/activate`)."""
    return await _action(request, who, functools.partial(
        users.activate_user, server_state(request).store, name=name),
        "/users", "activated")


# -- the forms' common parts ---------------------------------------------------------------

async def _form(request: Request, who: Principal) -> dict[str, str]:
    """The form's text fields, once its CSRF token is checked (a session's form must carry
    it; a bearer token's request needs none, as in the API).

    Raises:
        InvalidRequest: a field that is a file, or longer than MAX_FIELD_CHARS.
    """
    form = await request.form()
    cookie = request.cookies.get(SESSION_COOKIE)
    if who.via_session and cookie:
        check_form_csrf(request, cookie, str(form.get("csrf_token") or ""))
    fields: dict[str, str] = {}
    for key, value in form.items():
        if not isinstance(value, str):
            raise InvalidRequest(f"the form's field {key!r} is a file; it takes text")
        if len(value) > MAX_FIELD_CHARS:
            raise InvalidRequest(f"the form's field {key!r} is longer than "
                                 f"{MAX_FIELD_CHARS} characters")
        fields[key] = value
    return fields


async def _action(request: Request, who: Principal | None, act: Callable[..., object],
                  back: str, done: str, *, form: Mapping[str, str] | None = None,
                  recheck: str | None = None) -> Response:
    """A button's action: its CSRF check, the action as `who`, and back to `back` with the
    notice `done`; a refusal shows that page again with the service's sentence."""
    if who is None:
        return to_login(request)
    if form is None:
        await _form(request, who)
    try:
        await asyncio.to_thread(act, principal=who)
    except MusterError as exc:
        page = _account if back == "/account" else _users
        return page(request, who, status=_client_status(exc), problem=str(exc))
    server_state(request).follows.recheck(recheck or who.name)
    return _back(back, done)


def _client_status(exc: MusterError) -> int:
    """A refused form's status: the error's own 4xx; any other error is the server's, and
    goes on to the server's error handling (a page that says so, and the log)."""
    if 400 <= exc.http_status < 500:
        return exc.http_status
    raise exc


def _back(page: str, done: str) -> RedirectResponse:
    return RedirectResponse(f"{page}?done={done}", status_code=303)


def _shown_once(response: HTMLResponse) -> HTMLResponse:
    """A page that holds a secret: no cache keeps it, no back button shows it again."""
    response.headers["Cache-Control"] = "no-store"
    return response


def _duration(text: str) -> float | None:
    """The token form's `expires` ("30d", "12h"; empty: never)."""
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise InvalidRequest(f"expires: {exc}; write a duration such as 30d or 12h, or "
                             "leave it empty for a token that never expires") from exc


def _role(text: str) -> Role:
    try:
        return Role(text)
    except ValueError:
        raise InvalidRequest(f"role: {text!r} is no role; choose one of "
                             f"{', '.join(role.value for role in Role)}") from None
