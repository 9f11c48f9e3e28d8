"""Password logins and web sessions against a real server: the cookie's flags, CSRF on
every unsafe request, logout, and the limits on guessing, which a stranger cannot turn
against another user. The server trusts one proxy (`trusted_proxies`); the clients vary
their address by binding to other loopback addresses (127.0.0.0/8 is all this machine's)."""

from __future__ import annotations

from collections.abc import Iterator
from http.cookies import SimpleCookie

import httpx
import pytest

from muster.client import Client
from tests.servers import RunningServer, serving

pytestmark = pytest.mark.lifecycle  # a real server

API = "/api/v1"
PASSWORD = "correct horse battery"
PROXY = "127.0.0.5"  # the one address whose X-Forwarded-* the server believes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("server")
    config = root / "cluster.yaml"
    config.write_text(f"trusted_proxies: [{PROXY}]\n")
    with serving(root / "home", options=("--min-free-disk", "0", "--cluster-config",
                                         str(config))) as running:
        yield running


def from_address(server: RunningServer, address: str) -> httpx.Client:
    """A client whose connections come from `address` (a loopback one)."""
    return httpx.Client(base_url=server.url + API, timeout=30,
                        transport=httpx.HTTPTransport(local_address=address))


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
    server: RunningServer, browser: httpx.Client, people: dict[str, str]
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
    # Behind a TLS proxy: only a trusted one's X-Forwarded-Proto is believed.
    untrusted = log_in(browser, "alice", **{"X-Forwarded-Proto": "https"})
    assert not cookie_of(untrusted)["muster_session"]["secure"]
    with from_address(server, PROXY) as proxy:
        tls = log_in(proxy, "alice", **{"X-Forwarded-Proto": "https"})
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


def test_a_deactivated_user_s_session_ends(
    server: RunningServer, browser: httpx.Client, people: dict[str, str]
) -> None:
    with server.client() as admin:
        admin.create_user("hal", "user", password=PASSWORD)
        log_in(browser, "hal")
        assert browser.get("/whoami").status_code == 200
        admin.deactivate_user("hal")
        refused = browser.get("/whoami")  # the session ended with the deactivation
        assert refused.status_code == 401 and "it ended); log in again" in refused.text
        again = log_in(browser, "hal")
        assert again.status_code == 401 and "user hal is deactivated" in again.text


def test_guessing_is_slowed_per_address_and_name_and_the_answer_never_tells_names_apart(
    server: RunningServer, people: dict[str, str]
) -> None:
    with from_address(server, "127.0.0.9") as guesser:
        for _ in range(5):
            assert log_in(guesser, "nobody-at-all", "x" * 9).json()["message"] == (
                "wrong user name or password")
        for _ in range(5):
            wrong = log_in(guesser, "gus", "not the password")
            assert wrong.status_code == 401
            assert wrong.json()["message"] == "wrong user name or password"
        locked = log_in(guesser, "gus")  # even the right password, for now (1 s)
        assert locked.status_code == 429
        assert 0 < int(locked.headers["Retry-After"]) <= 300
        assert "too many failed logins for gus from 127.0.0.9" in locked.json()["message"]
    with Client(url=server.url, token=people["gus"]) as gus:
        assert gus.whoami()["name"] == "gus"  # the API token is not locked out
    with from_address(server, "127.0.0.10") as elsewhere:
        assert log_in(elsewhere, "gus").status_code == 200


def test_fifty_wrong_passwords_for_admin_lock_out_no_other_address(
    server: RunningServer
) -> None:
    admin_password = "the admin's own password"
    with server.client() as admin:
        admin.edit_user("admin", password=admin_password)
    with from_address(server, "127.0.0.2") as stranger:
        answers = {log_in(stranger, "admin", "guess").status_code for _ in range(50)}
        assert answers == {401, 429}
        assert log_in(stranger, "admin", admin_password).status_code == 429
    with from_address(server, "127.0.0.3") as elsewhere:
        assert log_in(elsewhere, "admin", admin_password).status_code == 200
    # A stranger behind the admin's own address (a NAT, a proxy not configured as one):
    with from_address(server, "127.0.0.4") as shared:
        assert log_in(shared, "admin", admin_password).status_code == 200
        for _ in range(10):
            assert log_in(shared, "admin", "guess").status_code == 401  # never a 429
        assert log_in(shared, "admin", admin_password).status_code == 200


def test_token_guesses_from_one_address_do_not_lock_another(
    server: RunningServer, people: dict[str, str]
) -> None:
    with from_address(server, "127.0.0.6") as guesser:
        answers = [guesser.post("/login", json={"token": "mst_" + "x" * 43}).status_code
                   for _ in range(20)]
        assert answers[:5] == [401] * 5 and 429 in answers
        refused = guesser.post("/login", json={"token": people["vera"]})
        assert refused.status_code == 429
        assert "too many failed logins for tokens from 127.0.0.6" in refused.text
    with from_address(server, "127.0.0.7") as other:
        assert other.post("/login", json={"token": "mst_" + "y" * 43}).status_code == 401
        assert other.post("/login", json={"token": people["vera"]}).status_code == 200


def guess_until_refused(http: httpx.Client, name: str, **headers: str) -> str:
    """Wrong passwords for `name` until a 429; its message."""
    for _ in range(50):
        answer = log_in(http, name, "not the password", **headers)
        if answer.status_code == 429:
            return str(answer.json()["message"])
        assert answer.status_code == 401, answer.text
    raise AssertionError(f"50 wrong passwords for {name} were never refused")


def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(
    server: RunningServer, people: dict[str, str]
) -> None:
    with from_address(server, "127.0.0.8") as direct:
        said = guess_until_refused(direct, "alice", **{"X-Forwarded-For": "203.0.113.9"})
        assert "for alice from 127.0.0.8" in said  # the peer's address, not the header's
        other = log_in(direct, "alice", **{"X-Forwarded-For": "203.0.113.10"})
        assert other.status_code == 429  # a new header does not start afresh
    with from_address(server, PROXY) as proxy:
        said = guess_until_refused(proxy, "alice", **{"X-Forwarded-For": "198.51.100.1"})
        assert "for alice from 198.51.100.1" in said
        other = log_in(proxy, "alice", **{"X-Forwarded-For": "198.51.100.2"})
        assert other.status_code == 200  # another client behind the proxy
        listed = proxy.get("/sessions").json()
        assert [s["address"] for s in listed if s["current"]] == ["198.51.100.2"]


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
