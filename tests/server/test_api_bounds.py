"""Numbers out of range: every id, attempt, rank, offset, tail, step and cursor the API
takes is bounded by what can hold it, so a value past it is a 4xx naming the parameter (a
422 for a parameter, a 400 for a cursor), never a driver overflow or a seek error (a 500),
and a follow from past the end of a log is refused before its 200."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.experiments import only_trial, run_to_end
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts a real server and a trial

server = shared_server()

API = "/api/v1"
MAX_ID = 2**31 - 1  # an INTEGER column in PostgreSQL
MAX_OFFSET = 2**63 - 1  # a file offset
LOG = b"hello from exit0\n"  # what exit0.sh writes


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    token = server.token
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def trial_id(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> int:
    """A SUCCEEDED trial whose log is `LOG`."""
    with server.client() as client:
        trial = only_trial(run_to_end(client, tmp_path_factory.mktemp("ctx"), "exit0.sh"))
    assert trial["state"] == "SUCCEEDED", trial
    number: int = trial["id"]
    return number


def id_routes(http: httpx.Client) -> list[tuple[str, str, str]]:
    """(method, path, id parameter) of every route that takes an id, from /openapi.json; a
    second id in the path (`/trials/{trial_id}/diff/{other_id}`) is filled with 1."""
    routes = []
    for path, operations in http.get("/openapi.json").json()["paths"].items():
        for name in ("trial_id", "experiment_id"):
            if "{" + name + "}" in path:
                filled = path.replace("{other_id}", "1")
                routes += [(method.upper(), filled, name) for method in operations]
    return routes


def error(response: httpx.Response, status: int) -> str:
    """The message of a `{error, message}` answer with `status`."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"error", "message"}, body
    message: str = body["message"]
    return message


def logs(http: httpx.Client, trial_id: int, **params: Any) -> httpx.Response:
    return http.get(f"{API}/trials/{trial_id}/logs", params=params)


@pytest.mark.parametrize("value", [0, MAX_ID + 1, 10**20], ids=["zero", "past-int32", "huge"])
def test_an_id_out_of_range_is_a_422_naming_it_on_every_route(
    http: httpx.Client, value: int
) -> None:
    routes = id_routes(http)
    assert len(routes) >= 13, routes
    for method, path, name in routes:
        response = http.request(method, path.replace("{" + name + "}", str(value)),
                                json={"priority": 1})
        message = error(response, 422)
        assert f"path.{name}: Input should be" in message, (method, path, message)


def test_the_largest_id_is_just_missing(http: httpx.Client) -> None:
    for method, path, name in id_routes(http):
        # (`pattern`: what the log search requires; the other routes take no such parameter;
        # a drill's body has defaults for every field, and takes no other)
        body = {} if path.endswith("/drills") else {"priority": 1, "decision": "approve",
                                                     "note": "n", "reviewer": "r"}
        response = http.request(method, path.replace("{" + name + "}", str(MAX_ID)),
                                params={"pattern": "x"}, json=body)
        assert f"{MAX_ID} does not exist" in error(response, 404), (method, path)


@pytest.mark.parametrize(("param", "value"), [
    ("offset", MAX_OFFSET + 1), ("tail", MAX_OFFSET + 1), ("attempt", MAX_ID + 1),
    ("rank", MAX_ID + 1), ("offset", int("9" * 30)),
])
def test_a_log_parameter_out_of_range_is_a_422_naming_it(
    http: httpx.Client, trial_id: int, param: str, value: int
) -> None:
    for follow in ("false", "true"):
        message = error(logs(http, trial_id, follow=follow, **{param: value}), 422)
        assert f"query.{param}: Input should be" in message


def test_the_largest_offset_reads_nothing(http: httpx.Client, trial_id: int) -> None:
    read = logs(http, trial_id, rank=0, offset=MAX_OFFSET)
    assert read.status_code == 200, read.text
    assert read.content == b"" and read.headers["X-Muster-Next-Offset"] == str(MAX_OFFSET)


def test_the_largest_tail_is_the_whole_log(http: httpx.Client, trial_id: int) -> None:
    for params in ({"rank": 0}, {}):
        read = logs(http, trial_id, tail=MAX_OFFSET, **params)
        assert (read.status_code, read.content) == (200, LOG), read.text


@pytest.mark.parametrize("cursor", [f"0:{MAX_OFFSET + 1}", f"{MAX_ID + 1}:0",
                                    "0:" + "9" * 5000, f"{'9' * 30}:0"])
def test_a_cursor_out_of_range_is_a_400_that_says_so(
    http: httpx.Client, trial_id: int, cursor: str
) -> None:
    message = error(logs(http, trial_id, cursor=cursor), 400)
    assert f"offsets up to {MAX_OFFSET}" in message and "X-Muster-Next-Cursor" in message


def test_a_cursor_at_the_largest_offset_reads_nothing(http: httpx.Client, trial_id: int) -> None:
    read = logs(http, trial_id, cursor=f"0:{MAX_OFFSET}")
    assert (read.status_code, read.content) == (200, b""), read.text


@pytest.mark.parametrize("offset", [len(LOG) + 1, 10**6, MAX_OFFSET])
def test_a_follow_from_past_the_end_is_refused_before_its_200(
    http: httpx.Client, trial_id: int, offset: int
) -> None:
    with http.stream("GET", f"{API}/trials/{trial_id}/logs",
                     params={"follow": "true", "rank": 0, "offset": offset}) as response:
        response.read()
    message = error(response, 400)
    assert f"offset {offset} is past the end of rank 0's log of attempt 1" in message
    assert f"({len(LOG)} bytes so far); pass an offset up to {len(LOG)}" in message


def test_a_follow_from_the_end_streams_what_comes(http: httpx.Client, trial_id: int) -> None:
    for offset, rest in ((len(LOG), b""), (6, LOG[6:])):
        with http.stream("GET", f"{API}/trials/{trial_id}/logs",
                         params={"follow": "true", "rank": 0, "offset": offset}) as response:
            assert response.status_code == 200
            assert response.read() == rest


@pytest.mark.parametrize("after_step", [2**63, -(2**63) - 1])
def test_a_step_out_of_range_is_a_422(
    http: httpx.Client, trial_id: int, after_step: int
) -> None:
    response = http.get(f"{API}/trials/{trial_id}/metrics", params={"after_step": after_step})
    assert "query.after_step: Input should be" in error(response, 422)


@pytest.mark.parametrize("after_step", [2**63 - 1, -(2**63)])
def test_the_extreme_steps_are_answered(
    http: httpx.Client, trial_id: int, after_step: int
) -> None:
    response = http.get(f"{API}/trials/{trial_id}/metrics", params={"after_step": after_step})
    assert (response.status_code, response.json()) == (200, []), response.text


def test_a_body_that_is_not_json_is_a_documented_400(http: httpx.Client, trial_id: int) -> None:
    path = f"{API}/trials/{trial_id}/priority"
    response = http.post(path, content=b"\xff\xfe{", headers={"Content-Type": "application/json"})
    message = error(response, 400)
    assert message.startswith(f"There was an error parsing the body: POST {path}")
    assert "UTF-8 JSON" in message
    documented = http.get("/openapi.json").json()["paths"][
        f"{API}/trials/{{trial_id}}/priority"]["post"]["responses"]
    assert "400" in documented
