"""Every response carries the security headers, whatever answered it: a page, the API, a
static file, an error, a 404, a 401, a refused body (muster.server.security_headers)."""

from __future__ import annotations

import httpx
import pytest

from muster.server.security_headers import CONTENT_SECURITY_POLICY, HEADERS
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server

server = shared_server()

EXPECTED = {
    "content-security-policy": ("default-src 'self'; script-src 'self'; object-src 'none'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def test_the_policy_allows_no_inline_script_and_no_eval() -> None:
    assert {name.lower(): value for name, value in HEADERS.items()} == EXPECTED
    assert "unsafe" not in CONTENT_SECURITY_POLICY


@pytest.mark.parametrize(("method", "path", "authorized", "status"), [
    ("GET", "/login", False, 200),  # a page
    ("GET", "/", False, 200),  # the login form, to a visitor
    ("GET", "/cluster", True, 200),  # a page, logged in
    ("GET", "/api/v1/cluster", True, 200),  # the API
    ("GET", "/api/v1/health", False, 200),
    ("GET", "/openapi.json", False, 200),
    ("GET", "/metrics", True, 200),  # Prometheus
    ("GET", "/static/muster.css", False, 200),
    ("GET", "/static/charts.js", False, 200),
    ("GET", "/static/vendor/htmx.min.js", False, 200),
    ("GET", "/static/nothing.js", False, 404),
    ("GET", "/api/v1/no-such-route", True, 404),
    ("GET", "/no-such-page", True, 404),  # the HTML error page
    ("GET", "/api/v1/experiments/999999", True, 404),  # muster's NotFound
    ("GET", "/api/v1/experiments", False, 401),
    ("GET", "/api/v1/experiments?limit=0", True, 422),
    ("DELETE", "/api/v1/cluster", True, 405),
])
def test_every_response_carries_the_headers(server: RunningServer, method: str, path: str,
                                            authorized: bool, status: int) -> None:
    headers = {"Authorization": f"Bearer {server.token}"} if authorized else {}
    answer = httpx.request(method, server.url + path, headers=headers, timeout=30,
                           follow_redirects=False)
    assert answer.status_code == status, answer.text
    assert {name: answer.headers.get(name) for name in EXPECTED} == EXPECTED
    assert len(answer.headers.get_list("content-security-policy")) == 1


def test_a_refused_body_carries_them_too(server: RunningServer) -> None:
    """BodyLimit answers before any route: the headers are added outside it."""
    answer = httpx.post(f"{server.url}/api/v1/experiments/1/priority", content=b"x" * 100_000,
                        headers={"Authorization": f"Bearer {server.token}",
                                 "Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 413, answer.text
    assert {name: answer.headers.get(name) for name in EXPECTED} == EXPECTED
