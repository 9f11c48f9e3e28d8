"""Sessions follow their credentials (issue 29), on a real server over real HTTP: a web
session opened with an API token ends when that token is revoked or expires; users list
and end their own sessions, admins anyone's; deactivating a user, or changing a password,
ends sessions; and an open log follow ends within the re-check interval (lowered here
through MUSTER_FOLLOW_RECHECK_SECONDS) once its credential no longer works."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from muster.client import Client
from muster.errors import Unauthorized
from tests.cli.test_cli import assert_clean_failure, muster
from tests.server.experiments import create, only_trial, wait_trial
from tests.servers import RunningServer, serving, shared_server
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server and a trial

server = shared_server(env={"MUSTER_FOLLOW_RECHECK_SECONDS": "0.2"})
API = "/api/v1"
PASSWORD = "correct horse battery"
_names = (f"user{n}" for n in itertools.count(1))


@pytest.fixture(scope="module")
def admin(server: RunningServer) -> Iterator[Client]:
    with server.client() as client:
        yield client


@contextmanager
def running_trial(admin: Client, parent: Path) -> Iterator[int]:
    """A trial that runs until the block ends: every follow of it ends only if the server
    ends it."""
    release = parent / "release"
    trial_id = int(only_trial(create(admin, parent, "wait_for_file.py", str(release)))["id"])
    wait_trial(admin, trial_id, {"RUNNING"})
    try:
        yield trial_id
    finally:
        release.touch()
        wait_trial(admin, trial_id, {"SUCCEEDED"})


@pytest.fixture(scope="module")
def running(admin: Client, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with running_trial(admin, tmp_path_factory.mktemp("trial")) as trial_id:
        yield trial_id


def new_user(admin: Client) -> tuple[str, str]:
    """A fresh user with a password: (name, their first API token)."""
    name = next(_names)
    return name, admin.create_user(name, "user", password=PASSWORD)["token"]


def browser(server: RunningServer, stack: ExitStack, **login: str) -> httpx.Client:
    """A browser logged in (`name` and `password`, or `token`), sending the session's CSRF
    token on every request as the UI's pages do."""
    http = stack.enter_context(httpx.Client(base_url=server.url + API,
                                            timeout=httpx.Timeout(30.0, read=20.0)))
    done = http.post("/login", json=login)
    assert done.status_code == 200, done.text
    http.headers["X-CSRF-Token"] = done.json()["csrf_token"]
    return http


def bearer(server: RunningServer, stack: ExitStack, token: str) -> httpx.Client:
    return stack.enter_context(httpx.Client(
        base_url=server.url + API, headers={"Authorization": f"Bearer {token}"},
        timeout=httpx.Timeout(30.0, read=20.0)))


def follow(http: httpx.Client, stack: ExitStack, trial_id: int) -> Iterator[bytes]:
    """An open follow of the trial's log, its first bytes read: the rest to come."""
    response = stack.enter_context(http.stream("GET", f"/trials/{trial_id}/logs",
                                               params={"follow": "true"}))
    assert response.status_code == 200, response.read()
    rest = response.iter_raw()
    assert next(rest).startswith(b"waiting")
    return rest


def ends(rest: Iterator[bytes]) -> None:
    """The follow ends cleanly (its trial still runs): the server ended it. A follow the
    server kept open would fail here with a ReadTimeout after 20 s of silence."""
    for _ in rest:
        pass


def test_revoking_the_token_that_opened_a_session_ends_it_and_its_follows(
    server: RunningServer, admin: Client, running: int
) -> None:
    name, first = new_user(admin)
    with Client(url=server.url, token=first) as user, ExitStack() as stack:
        laptop = user.create_token("laptop")
        http = browser(server, stack, token=laptop["token"])
        listed = user.list_sessions()
        assert [(s["opened_with"], s["opened_with_name"], s["address"]) for s in listed] == [
            (laptop["id"], "laptop", "127.0.0.1")]
        by_cookie = follow(http, stack, running)
        by_token = follow(bearer(server, stack, laptop["token"]), stack, running)
        user.revoke_token(laptop["id"])
        refused = http.get("/whoami")
        assert refused.status_code == 401, refused.text
        assert "log in again" in refused.json()["message"]
        ends(by_cookie)
        ends(by_token)
        assert user.list_sessions() == []
        assert user.whoami()["name"] == name  # the other token is untouched
    assert admin.get_trial(running)["state"] == "RUNNING"


def test_a_session_opened_with_a_token_ends_when_the_token_expires(
    server: RunningServer, admin: Client, running: int
) -> None:
    _, first = new_user(admin)
    with Client(url=server.url, token=first) as user, ExitStack() as stack:
        brief = user.create_token("brief", expires="8s")  # time to log in and follow
        http = browser(server, stack, token=brief["token"])
        assert user.list_sessions()[0]["expires_at"] == brief["expires_at"]
        open_follow = follow(http, stack, running)
        ends(open_follow)
        wait_until(lambda: http.get("/whoami").status_code == 401,
                   what="the session to end with its token", timeout=30)
        assert "has expired" in http.get("/whoami").text


def test_users_list_and_end_their_own_sessions_and_admins_anyones(
    server: RunningServer, admin: Client
) -> None:
    name, _ = new_user(admin)
    _, other_token = new_user(admin)
    with ExitStack() as stack:
        home = browser(server, stack, name=name, password=PASSWORD)
        work = browser(server, stack, name=name, password=PASSWORD)
        listed = home.get("/sessions").json()
        assert [s["current"] for s in listed] == [True, False]
        assert all(s["opened_with"] is None and s["user"] == name for s in listed)
        work_id = listed[1]["id"]
        ended = home.delete(f"/sessions/{work_id}")
        assert ended.status_code == 200 and ended.json()["ended"] is True
        assert work.get("/whoami").status_code == 401
        home_id = listed[0]["id"]
        stranger = bearer(server, stack, other_token)
        assert stranger.delete(f"/sessions/{home_id}").status_code == 403
        assert stranger.get("/sessions", params={"user": name}).status_code == 403
        assert home.get("/whoami").status_code == 200  # a stranger ended nothing
        assert [s["id"] for s in admin.list_sessions(name)] == [home_id]
        admin.end_session(home_id)
        assert home.get("/whoami").status_code == 401
        assert admin.list_sessions(name) == []
        assert stranger.delete("/sessions/" + "0" * 16).status_code == 404


def test_session_list_and_end_on_the_command_line(server: RunningServer,
                                                  admin: Client) -> None:
    name, first = new_user(admin)
    with ExitStack() as stack:
        http = browser(server, stack, name=name, password=PASSWORD)
        listed = muster(server.home, server.url, "session", "list", token=first)
        assert listed.returncode == 0 and "password" in listed.stdout
        session_id = http.get("/sessions").json()[0]["id"]
        assert session_id in listed.stdout
        done = muster(server.home, server.url, "session", "end", session_id, token=first)
        assert done.returncode == 0 and f"web session {session_id} of {name} ended" in (
            done.stdout)
        assert http.get("/whoami").status_code == 401
        other, _ = new_user(admin)
        refused = muster(server.home, server.url, "session", "list", "--user", other,
                         token=first)
        assert "admin" in assert_clean_failure(refused)


def test_deactivating_a_user_ends_their_sessions_and_follows(
    server: RunningServer, admin: Client, running: int
) -> None:
    name, first = new_user(admin)
    with ExitStack() as stack:
        http = browser(server, stack, name=name, password=PASSWORD)
        by_cookie = follow(http, stack, running)
        by_token = follow(bearer(server, stack, first), stack, running)
        admin.deactivate_user(name)
        ends(by_cookie)
        ends(by_token)
        assert admin.list_sessions(name) == []
        admin.activate_user(name)
        assert http.get("/whoami").status_code == 401  # ended, not only paused
        with Client(url=server.url, token=first) as user:
            assert user.whoami()["name"] == name  # API tokens work again


def test_a_password_change_ends_the_password_sessions_but_the_one_that_made_it(
    server: RunningServer, admin: Client
) -> None:
    name, first = new_user(admin)
    with ExitStack() as stack:
        changer = browser(server, stack, name=name, password=PASSWORD)
        elsewhere = browser(server, stack, name=name, password=PASSWORD)
        by_token = browser(server, stack, token=first)
        changed = changer.patch(f"/users/{name}", json={
            "password": "a brand new password", "current_password": PASSWORD})
        assert changed.status_code == 200, changed.text
        assert changer.get("/whoami").status_code == 200
        assert elsewhere.get("/whoami").status_code == 401
        assert by_token.get("/whoami").status_code == 200  # it follows its token
        admin.edit_user(name, password="an admin's new one")
        assert changer.get("/whoami").status_code == 401


def test_an_action_that_ends_a_credential_ends_its_follows_at_once(
    tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With the default re-check interval (30 s, longer than `ends` waits): revoking a
    token, ending a session and logging out each end their follows at once."""
    root = tmp_path_factory.mktemp("default")
    with serving(root / "home") as default, default.client() as admin, \
            running_trial(admin, root) as trial_id, ExitStack() as stack:
        _, first = new_user(admin)
        with Client(url=default.url, token=first) as user:
            laptop = user.create_token("laptop")
            by_token = follow(bearer(default, stack, laptop["token"]), stack, trial_id)
            user.revoke_token(laptop["id"])
            ends(by_token)
            http = browser(default, stack, token=first)
            by_cookie = follow(http, stack, trial_id)
            user.end_session(user.list_sessions()[0]["id"])
            ends(by_cookie)
            http = browser(default, stack, token=first)
            by_cookie = follow(http, stack, trial_id)
            assert http.post("/logout").status_code == 204
            ends(by_cookie)


def test_the_account_page_lists_and_ends_sessions_and_tokens(
    server: RunningServer, admin: Client
) -> None:
    name, first = new_user(admin)
    with ExitStack() as stack:
        other = browser(server, stack, name=name, password=PASSWORD)
        page = stack.enter_context(httpx.Client(base_url=server.url, timeout=30))
        assert page.post(API + "/login", json={"name": name, "password": PASSWORD}
                         ).status_code == 200
        shown = page.get("/account")
        assert shown.status_code == 200 and "(this one)" in shown.text
        sessions = other.get("/sessions").json()
        other_id = next(s["id"] for s in sessions if s["current"])
        csrf = other.headers["X-CSRF-Token"]
        assert f"/account/sessions/{other_id}/end" in shown.text
        forged = page.post(f"/account/sessions/{other_id}/end", data={"csrf_token": "x"})
        assert forged.status_code == 403
        assert other.get("/whoami").status_code == 200
        own_csrf = page.get(API + "/whoami").json()["csrf_token"]
        assert own_csrf != csrf
        ended = page.post(f"/account/sessions/{other_id}/end", data={"csrf_token": own_csrf})
        assert ended.status_code == 303 and ended.headers["location"] == "/account?done=session"
        assert other.get("/whoami").status_code == 401
        token_id = admin.list_tokens(name)[0]["id"]
        revoked = page.post(f"/account/tokens/{token_id}/revoke",
                            data={"csrf_token": own_csrf})
        assert revoked.status_code == 303
        with Client(url=server.url, token=first) as user, pytest.raises(Unauthorized,
                                                                       match="revoked"):
            user.whoami()
