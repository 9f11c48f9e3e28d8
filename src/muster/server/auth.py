"""Who a request acts as: an API token (`Authorization: Bearer mst_...`) or a web session
(the `muster_session` cookie), and the CSRF check every unsafe request of a session passes.

A bearer token wins over a cookie: a browser never adds an Authorization header to a request
another site makes, so a token needs no CSRF check. A session's cookie is HttpOnly and
SameSite=Strict (and Secure over TLS); on top of that, a POST, PUT, PATCH or DELETE that
comes with it must carry the session's CSRF token in `X-CSRF-Token`, and a browser's
`Origin` header, when sent, must be this server's. What each action needs is
`muster.services.access`; the routes ask for it with `allow(action)`.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from muster.errors import Forbidden, Unauthorized
from muster.services import tokens
from muster.states import TokenKind

if TYPE_CHECKING:
    from muster.services.access import Principal
    from muster.store import Store

__all__ = ["CSRF_HEADER", "SESSION_COOKIE", "authenticate", "clear_session_cookie",
           "presented_token", "set_session_cookie"]

SESSION_COOKIE = "muster_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def presented_token(header: str | None) -> str:
    """The token an `Authorization: Bearer <token>` header presents ("" for another scheme)."""
    scheme, _, given = (header or "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def authenticate(request: Request, store: Store, csrf: bool = True) -> Principal:
    """The principal of `request`, from its bearer token, else its session cookie (whose
    unsafe requests must pass the CSRF check; `csrf=False` for a page's own form, which
    checks its hidden field instead).

    Raises:
        Unauthorized: no credential, or one that does not (or no longer) work.
        Forbidden: an unsafe request of a web session without its CSRF token, or from
            another origin.
    """
    bearer = presented_token(request.headers.get("authorization"))
    if bearer:
        return tokens.authenticate(store, bearer, TokenKind.API)
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie:
        raise Unauthorized(
            "no credentials: send `Authorization: Bearer <token>` (the CLI reads "
            "$MUSTER_TOKEN, your `muster login`, or the server's $MUSTER_HOME/secrets/token) "
            "or log in to the web UI")
    principal = tokens.authenticate(store, cookie, TokenKind.SESSION)
    if csrf and request.method not in SAFE_METHODS:
        check_csrf(request, cookie)
    return principal


def check_csrf(request: Request, session_secret: str) -> None:
    """Raise Forbidden unless the unsafe request of a web session is the page's own."""
    origin = request.headers.get("origin")
    if origin is not None and origin != own_origin(request):
        raise Forbidden(f"a request from {origin} cannot act with this server's web "
                        "session (cross-site request refused)")
    given = request.headers.get(CSRF_HEADER, "")
    expected = tokens.csrf_token(session_secret)
    if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode()):
        raise Forbidden(f"missing or wrong CSRF token: a web session's {request.method} "
                        f"sends the session's token in the {CSRF_HEADER} header (the login's "
                        "answer and GET /api/v1/whoami carry it)")


def own_origin(request: Request) -> str:
    """This server's origin as the browser sees it (scheme://host[:port])."""
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def set_session_cookie(response: Response, request: Request, secret: str) -> None:
    response.set_cookie(SESSION_COOKIE, secret, max_age=int(tokens.SESSION_SECONDS), path="/",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
