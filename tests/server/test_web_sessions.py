"""Password logins and web sessions against a real server: the cookie's flags, CSRF on
every unsafe request, logout, and the limit on guessing."""

from __future__ import annotations

from collections.abc import Iterator
from http.cookies import SimpleCookie

import httpx
import pytest

from muster.client import Client
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server

server = shared_server()
API = "/api/v1"
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def people(server: RunningServer) -> dict[str, str]:
    """Users with passwords: alice (user), vera (viewer), gus (user, for guessing)."""
    with server.client() as admin:
        return {name: admin.create_user(name, role, password=PASSWORD)["token"]
                for name, role in (("alice", "user"), ("vera", "viewer"), ("gus", "user"))}


@pytest.fixture
def browser(server: RunningServer) -> Iterator[httpx.Client]:
    """A cookie jar, like a browser's, on the server's origin."""
    with httpx.Client(base_url=server.url + API, timeout=30) as http:
        yield http


def log_in(browser: httpx.Client, name: str, password: str = PASSWORD,
           **headers: str) -> httpx.Response:
    return browser.post("/login", json={"name": name, "password": password}, headers=headers)


def cookie_of(response: httpx.Response) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    jar.load(response.headers["set-cookie"])
    return jar


def test_a_login_sets_an_http_only_strict_cookie_secure_over_tls(
    browser: httpx.Client, people: dict[str, str]
) -> None:
    done = log_in(browser, "alice")
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["name"], body["role"], body["via"]) == ("alice", "user", "session")
    assert len(body["csrf_token"]) == 64 and body["expires_at"] > 0
    morsel = cookie_of(done)["muster_session"]
    assert morsel.value.startswith("mss_")
    assert morsel["httponly"] is True and morsel["samesite"].lower() == "strict"
    assert morsel["path"] == "/" and int(morsel["max-age"]) == 12 * 3600
    assert not morsel["secure"]  # plain HTTP here
    # Behind a TLS proxy on this machine (uvicorn trusts 127.0.0.1's X-Forwarded-Proto):
    tls = log_in(browser, "alice", **{"X-Forwarded-Proto": "https"})
    assert cookie_of(tls)["muster_session"]["secure"] is True


def test_every_unsafe_request_of_a_session_needs_its_csrf_token(
    server: RunningServer, browser: httpx.Client, people: dict[str, str]
) -> None:
    csrf = log_in(browser, "alice").json()["csrf_token"]
    assert browser.get("/whoami").json()["csrf_token"] == csrf  # a GET needs none
    body = {"name": "from the browser"}
    missing = browser.post("/tokens", json=body)
    assert missing.status_code == 403 and "missing or wrong CSRF token" in missing.text
    wrong = browser.post("/tokens", json=body, headers={"X-CSRF-Token": "0" * 64})
    assert wrong.status_code == 403
    other_site = browser.post("/tokens", json=body, headers={
        "X-CSRF-Token": csrf, "Origin": "https://evil.example"})
    assert other_site.status_code == 403 and "cross-site" in other_site.text
    same_site = browser.post("/tokens", json=body, headers={"X-CSRF-Token": csrf,
                                                            "Origin": server.url})
    assert same_site.status_code == 201, same_site.text
    assert browser.post("/experiments/1/kill").status_code == 403  # no CSRF: refused first


def test_logout_ends_the_session_at_once(browser: httpx.Client, people: dict[str, str]) -> None:
    done = log_in(browser, "vera")
    session = browser.cookies["muster_session"]
    csrf = done.json()["csrf_token"]
    assert browser.get("/whoami").json()["name"] == "vera"
    out = browser.post("/logout", headers={"X-CSRF-Token": csrf})
    assert out.status_code == 204
    assert 'muster_session=""' in out.headers["set-cookie"]
    replay = httpx.get(str(browser.base_url).rstrip("/") + "/whoami",
                       cookies={"muster_session": session}, timeout=30)
    assert replay.status_code == 401 and "log in again" in replay.json()["message"]


def test_a_session_is_no_api_token_and_an_api_token_no_session(
    server: RunningServer, browser: httpx.Client, people: dict[str, str]
) -> None:
    log_in(browser, "alice")
    session = browser.cookies["muster_session"]
    as_bearer = httpx.get(server.url + API + "/whoami", timeout=30,
                          headers={"Authorization": f"Bearer {session}"})
    assert as_bearer.status_code == 401
    as_cookie = httpx.get(server.url + API + "/whoami", timeout=30,
                          cookies={"muster_session": people["alice"]})
    assert as_cookie.status_code == 401


def test_a_deactivated_user_s_session_ends_with_the_next_request(
    server: RunningServer, browser: httpx.Client, people: dict[str, str]
) -> None:
    with server.client() as admin:
        admin.create_user("hal", "user", password=PASSWORD)
        log_in(browser, "hal")
        assert browser.get("/whoami").status_code == 200
        admin.deactivate_user("hal")
        refused = browser.get("/whoami")
        assert refused.status_code == 401 and "user hal is deactivated" in refused.text
        assert log_in(browser, "hal").status_code == 401


def test_guessing_is_limited_per_name_and_the_answer_never_tells_names_apart(
    server: RunningServer, people: dict[str, str]
) -> None:
    with httpx.Client(base_url=server.url + API, timeout=30) as guesser:
        for _ in range(5):
            wrong = log_in(guesser, "gus", "not the password")
            assert wrong.status_code == 401
            assert wrong.json()["message"] == "wrong user name or password"
            assert log_in(guesser, "nobody-at-all", "x" * 9).json()["message"] == (
                "wrong user name or password")
        locked = log_in(guesser, "gus")  # even the right password, for now
        assert locked.status_code == 429
        assert 0 < int(locked.headers["Retry-After"]) <= 300
        assert "too many failed logins for user gus" in locked.json()["message"]
    with Client(url=server.url, token=people["gus"]) as gus:
        assert gus.whoami()["name"] == "gus"  # the API token is not locked out


def test_an_api_token_opens_a_web_session_too(
    server: RunningServer, browser: httpx.Client, people: dict[str, str]
) -> None:
    done = browser.post("/login", json={"token": people["vera"]})
    assert done.status_code == 200, done.text
    assert (done.json()["name"], done.json()["via"]) == ("vera", "session")
    assert browser.get("/whoami").json()["via"] == "session"
    neither = browser.post("/login", json={"name": "vera"})
    assert neither.status_code == 400 and "log in with `name` and `password`" in neither.text
    wrong = browser.post("/login", json={"token": "mst_" + "x" * 43})
    assert wrong.status_code == 401


def test_the_list_pages_on_the_server(server: RunningServer, people: dict[str, str]) -> None:
    with server.client() as admin:
        for number in range(3):
            admin.create_experiment(f"name: paged-{number}\nentrypoint: ['true']\n"
                                    "labels: [paged]\n", None)
    response = httpx.get(server.url + API + "/experiments", timeout=30,
                         params={"label": "paged", "sort": "name", "order": "desc",
                                 "limit": 2},
                         headers={"Authorization": f"Bearer {people['vera']}"})
    assert response.status_code == 200 and response.headers["X-Total-Count"] == "3"
    assert [e["name"] for e in response.json()] == ["paged-2", "paged-1"]
    assert {"progress", "awaiting_review", "unverified", "best"} <= set(response.json()[0])
