"""`GET /api/v1/events/stream` against a real server: server-sent events of the audit trail
as they are recorded, scoped to an experiment or a trial, resumed with Last-Event-ID, and
ended when the credential that opened them stops working."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.home import Home
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server, real trials

server = shared_server(env={"MUSTER_FOLLOW_RECHECK_SECONDS": "0.2"})

CONFIG = "name: {name}\nentrypoint: python wait.py\n"
WAIT = "import time\nwhile True:\n    time.sleep(1)\n"
END = object()  # the stream ended


class Stream:
    """One event stream read on a thread: its messages (`{event, id, data}`) in a queue."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.messages: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        message: dict[str, Any] = {}
        try:
            for line in self.response.iter_lines():
                if not line:
                    if "event" in message:
                        self.messages.put(message)
                    message = {}
                elif not line.startswith(":"):
                    field, _, value = line.partition(": ")
                    message[field] = json.loads(value) if field == "data" else value
        except httpx.HTTPError:
            pass  # closed by the test: the end below says so
        self.messages.put(END)

    def next(self, timeout: float = 20) -> Any:
        return self.messages.get(timeout=timeout)

    def events_until(self, event_id: int) -> list[dict[str, Any]]:
        """The `muster` messages, up to the one of `event_id`."""
        got = []
        while True:
            message = self.next()
            assert message is not END, f"the stream ended before event {event_id}"
            got.append(message)
            if message["event"] == "muster" and int(message["id"]) >= event_id:
                return got


@contextmanager
def opened(server: RunningServer, token: str, query: str = "",
           headers: dict[str, str] | None = None) -> Iterator[Stream]:
    with httpx.Client(timeout=httpx.Timeout(30, read=60)) as http, http.stream(
            "GET", f"{server.url}/api/v1/events/stream?{query}",
            headers={"Authorization": f"Bearer {token}", **(headers or {})}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        stream = Stream(response)
        ready = stream.next()
        assert ready["event"] == "ready", ready
        yield stream


def _experiment(client: Client, tmp_path: Path, name: str) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "wait.py").write_text(WAIT)
    return client.create_experiment(CONFIG.format(name=name), tmp_path)


def test_a_stream_sends_its_experiments_events_as_they_are_recorded(
    server: RunningServer, tmp_path: Path
) -> None:
    with Client(url=server.url, token=server.token, home=Home(server.home)) as admin:
        mine = _experiment(admin, tmp_path / "a", "streamed")
        other = _experiment(admin, tmp_path / "b", "elsewhere")
        try:
            with opened(server, server.token, f"experiment_id={mine['id']}") as stream:
                admin.set_experiment_priority(other["id"], 33)  # not this stream's
                admin.set_experiment_priority(mine["id"], 44)
                (last,) = admin.list_events(experiment_id=mine["id"], tail=1)
                got = stream.events_until(last["id"])
            assert all(m["data"]["experiment_id"] == mine["id"] for m in got)
            assert got[-1]["data"] == last
            assert got[-1]["id"] == str(last["id"])
        finally:
            admin.kill_experiment(mine["id"])
            admin.kill_experiment(other["id"])


def test_a_stream_resumes_after_its_last_event_id(server: RunningServer, tmp_path: Path
                                                  ) -> None:
    with Client(url=server.url, token=server.token, home=Home(server.home)) as admin:
        exp = _experiment(admin, tmp_path, "resumed")
        try:
            for priority in (11, 12, 13):
                admin.set_experiment_priority(exp["id"], priority)
            every = admin.list_events(experiment_id=exp["id"], limit=1000)
            point = every[-3]["id"]
            with opened(server, server.token, f"experiment_id={exp['id']}",
                        {"Last-Event-ID": str(point)}) as stream:
                got = stream.events_until(every[-1]["id"])
            assert [int(m["id"]) for m in got] == [e["id"] for e in every[-2:]]
        finally:
            admin.kill_experiment(exp["id"])


def test_a_stream_ends_when_its_token_is_revoked(server: RunningServer) -> None:
    with Client(url=server.url, token=server.token, home=Home(server.home)) as admin:
        made = admin.create_token("for a stream")
        with opened(server, made["token"]) as stream:
            admin.revoke_token(made["id"])
            while (message := stream.next(timeout=30)) is not END:  # the server's events
                assert message["event"] == "muster", message


@pytest.mark.parametrize(("query", "headers", "status"), [
    ("experiment_id=999999", {}, 404),
    ("trial_id=0", {}, 422),
    ("", {"Last-Event-ID": "yesterday"}, 400),
])
def test_a_bad_stream_request_is_refused_before_it_streams(
    server: RunningServer, query: str, headers: dict[str, str], status: int
) -> None:
    answer = httpx.get(f"{server.url}/api/v1/events/stream?{query}", timeout=30,
                       headers={"Authorization": f"Bearer {server.token}", **headers})
    assert answer.status_code == status, answer.text
    assert "message" in answer.json()
