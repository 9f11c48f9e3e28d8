"""At most `MAX_FOLLOWS_PER_TOKEN` open log follows per user: the next is a 429 with
`Retry-After`, and a place comes back when a stream ends or its client goes away (real
streams on a real server, closed as a client closes them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from muster.server.follows import MAX_FOLLOWS_PER_TOKEN, RETRY_AFTER_SECONDS
from tests.cli.test_cli import assert_clean_failure, on
from tests.server.experiments import create, only_trial, wait_trial
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # starts a real server and trials

server = shared_server()

API = "/api/v1"


@pytest.fixture
def http(server: RunningServer) -> Iterator[httpx.Client]:
    token = server.token
    limits = httpx.Limits(max_connections=2 * MAX_FOLLOWS_PER_TOKEN)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                      timeout=httpx.Timeout(30.0, read=None), limits=limits) as client:
        yield client


@pytest.fixture
def running(server: RunningServer, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A RUNNING trial that ends when its release file is made (at the latest, afterwards),
    and that file."""
    release = tmp_path / "release"
    with server.client() as client:
        trial_id = only_trial(create(client, tmp_path, "wait_for_file.py", str(release)))["id"]
        wait_trial(client, trial_id, {"RUNNING"})
        try:
            yield trial_id, release
        finally:
            release.touch()
            wait_trial(client, trial_id, {"SUCCEEDED"})


def follow(http: httpx.Client, stack: ExitStack, trial_id: int) -> httpx.Response:
    """A follow of the trial's log, open until `stack` closes (the status and headers read,
    the body not yet)."""
    return stack.enter_context(
        http.stream("GET", f"{API}/trials/{trial_id}/logs", params={"follow": "true"}))


def hold(http: httpx.Client, stack: ExitStack, trial_id: int, count: int) -> list[httpx.Response]:
    """`count` open follows. A place that an earlier stream gave back as it closed may take
    the server a moment to see, so a 429 is tried again until the place is free."""
    held = []
    for _ in range(count):
        def opened() -> httpx.Response | None:
            with ExitStack() as attempt:
                response = follow(http, attempt, trial_id)
                if response.status_code == 429:
                    return None
                assert response.status_code == 200, response.read()
                stack.push(attempt.pop_all())
                return response
        held.append(wait_until(opened, what="a follow to be let in"))
    return held


def refused(http: httpx.Client, trial_id: int) -> httpx.Response:
    with ExitStack() as stack:
        response = follow(http, stack, trial_id)
        response.read()
        return response


def assert_too_many(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    body = response.json()
    assert body["error"] == "TooManyRequests"
    assert f"{MAX_FOLLOWS_PER_TOKEN} streams (log follows and live pages) already open" in \
        body["message"]
    assert "close one (a browser tab, or Ctrl-C a `muster trial logs -f`) and retry" in \
        body["message"]


def test_the_follow_past_the_limit_is_a_429_before_any_stream(
    http: httpx.Client, running: tuple[int, Path]
) -> None:
    trial_id, _ = running
    with ExitStack() as stack:
        hold(http, stack, trial_id, MAX_FOLLOWS_PER_TOKEN)
        assert_too_many(refused(http, trial_id))
        # Only follows count: reads go on as before.
        read = http.get(f"{API}/trials/{trial_id}/logs")
        assert read.status_code == 200 and read.content == b"waiting\n"


def test_the_429_is_documented_with_its_header(http: httpx.Client) -> None:
    operation = http.get("/openapi.json").json()["paths"][f"{API}/trials/{{trial_id}}/logs"]
    refusal = operation["get"]["responses"]["429"]
    assert refusal["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
    assert "Retry-After" in refusal["headers"]


def test_a_client_that_goes_away_gives_its_place_back(
    http: httpx.Client, running: tuple[int, Path]
) -> None:
    trial_id, _ = running
    with ExitStack() as stack:
        held = hold(http, stack, trial_id, MAX_FOLLOWS_PER_TOKEN)
        for response in held[:3]:
            response.close()  # the connection is dropped mid-stream
        hold(http, stack, trial_id, 3)
        assert_too_many(refused(http, trial_id))  # given back once each, not more


def test_a_stream_that_ends_gives_its_place_back(
    http: httpx.Client, server: RunningServer, tmp_path: Path, running: tuple[int, Path]
) -> None:
    other, _ = running
    release = tmp_path / "release-first"
    with server.client() as client:
        first = only_trial(create(client, tmp_path, "wait_for_file.py", str(release)))["id"]
        wait_trial(client, first, {"RUNNING"})
    with ExitStack() as stack:
        held = hold(http, stack, first, MAX_FOLLOWS_PER_TOKEN)
        release.touch()
        for response in held:  # each to the end of the log: the trial ended
            assert b"".join(response.iter_bytes()) == b"waiting\nreleased\n"
        hold(http, stack, other, MAX_FOLLOWS_PER_TOKEN)
        assert_too_many(refused(http, other))


def test_a_refused_follow_holds_no_place(http: httpx.Client, running: tuple[int, Path]) -> None:
    trial_id, _ = running
    with ExitStack() as stack:
        hold(http, stack, trial_id, MAX_FOLLOWS_PER_TOKEN - 1)
        for _ in range(3):
            missing = refused(http, 2**31 - 1)
            assert missing.status_code == 404, missing.text
        hold(http, stack, trial_id, 1)
        assert_too_many(refused(http, trial_id))


def test_the_cli_says_so_in_one_line(
    http: httpx.Client, server: RunningServer, running: tuple[int, Path]
) -> None:
    trial_id, _ = running
    with ExitStack() as stack:
        hold(http, stack, trial_id, MAX_FOLLOWS_PER_TOKEN)
        done = on(server, "trial", "logs", "-f", str(trial_id))
    stderr = assert_clean_failure(done)
    assert stderr.splitlines() == [
        f"error: {MAX_FOLLOWS_PER_TOKEN} streams (log follows and live pages) already open for "
        "admin, the most one user may hold at once; close one (a browser tab, or Ctrl-C a "
        "`muster trial logs -f`) and retry"]


def test_the_limit_is_each_user_s_whatever_token_they_use(
    http: httpx.Client, server: RunningServer, running: tuple[int, Path]
) -> None:
    trial_id, _ = running
    with server.client() as admin:
        second = admin.create_token("second")["token"]
        other = admin.create_user("reader", "viewer")["token"]
    path = f"{API}/trials/{trial_id}/logs"
    with ExitStack() as stack:
        hold(http, stack, trial_id, MAX_FOLLOWS_PER_TOKEN)
        again = httpx.get(server.url + path, params={"follow": "true"}, timeout=30,
                          headers={"Authorization": f"Bearer {second}"})
        assert again.status_code == 429  # the same user, another token
        reader = stack.enter_context(httpx.stream(
            "GET", server.url + path, params={"follow": "true"}, timeout=30,
            headers={"Authorization": f"Bearer {other}"}))
        assert reader.status_code == 200  # another user has places of their own
