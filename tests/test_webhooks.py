"""muster's signed webhook (`muster.webhooks`) against a real HTTP receiver on a loopback
port: the body and its signature as the receiver checks them, the idempotency key, a 500,
a redirect that is not followed, a receiver that never answers, one that is not there."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from muster import webhooks

SECRET = b"a shared secret"
PAYLOAD = {"event": "trial suspect", "trial_id": 7, "message": "checkpoint: none — 0 files"}


@dataclass
class Receiver:
    """What the receiver got, and what it answers next: (status, headers, body, delay)."""

    url: str
    got: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    answer: tuple[int, dict[str, str], bytes, float] = (200, {}, b"ok", 0.0)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            found.got.append((self.path, dict(self.headers.items()), body))
            status, headers, answer, delay = found.answer
            time.sleep(delay)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    found.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def test_a_delivery_is_signed_and_carries_its_key(receiver: Receiver) -> None:
    done = webhooks.deliver(receiver.url, PAYLOAD, "event-41:sub-3", SECRET)

    assert (done.ok, done.status, done.error, done.answer) == (True, 200, None, "ok")
    [(path, headers, body)] = receiver.got
    assert path == "/hook" and json.loads(body) == PAYLOAD
    assert headers["Idempotency-Key"] == "event-41:sub-3"
    assert headers["Content-Type"] == "application/json"
    assert webhooks.verify(SECRET, headers["Muster-Signature"], body)
    # What a receiver must refuse: another body, another secret, an old or a bad header.
    assert not webhooks.verify(SECRET, headers["Muster-Signature"], body + b" ")
    assert not webhooks.verify(b"another secret", headers["Muster-Signature"], body)
    assert not webhooks.verify(SECRET, headers["Muster-Signature"], body,
                               now=time.time() + 301)
    for bad in ("", "t=x,v1=00", "v1=" + "0" * 64, "t=1"):
        assert not webhooks.verify(SECRET, bad, body)


def test_a_retry_of_the_same_notification_is_the_same_body_and_key(
        receiver: Receiver) -> None:
    for _ in range(2):
        webhooks.deliver(receiver.url, PAYLOAD, "event-41:sub-3", SECRET)
    first, second = receiver.got
    assert first[2] == second[2]
    assert first[1]["Idempotency-Key"] == second[1]["Idempotency-Key"]


def test_a_server_error_is_a_failure_with_the_start_of_its_answer(receiver: Receiver) -> None:
    receiver.answer = (500, {}, b"x" * 100_000, 0.0)
    done = webhooks.deliver(receiver.url, PAYLOAD, "k", SECRET)
    assert (done.ok, done.status, done.error) == (False, 500, "HTTP 500")
    assert done.answer == "x" * webhooks.RESPONSE_BYTES


def test_a_redirect_is_not_followed(receiver: Receiver) -> None:
    receiver.answer = (302, {"Location": "http://169.254.169.254/latest"}, b"", 0.0)
    done = webhooks.deliver(receiver.url, PAYLOAD, "k", SECRET)
    assert (done.ok, done.status) == (False, 302)
    assert done.error == "HTTP 302: redirects are not followed (to http://169.254.169.254/latest)"
    assert len(receiver.got) == 1


def test_a_receiver_that_does_not_answer_in_time_or_is_not_there(receiver: Receiver) -> None:
    receiver.answer = (200, {}, b"late", 3.0)
    done = webhooks.deliver(receiver.url, PAYLOAD, "k", SECRET, timeout=0.5)
    assert (done.ok, done.status) == (False, None)
    assert done.error is not None and done.error.startswith("ReadTimeout")
    assert done.seconds < 2.5
    gone = webhooks.deliver("http://127.0.0.1:9/hook", PAYLOAD, "k", SECRET, timeout=2)
    assert (gone.ok, gone.status) == (False, None)
    assert gone.error is not None and gone.error.startswith("ConnectError")


def test_backoff_doubles_spreads_and_is_capped() -> None:
    assert [webhooks.backoff(n, jitter=0.0) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert webhooks.backoff(1, jitter=0.99) == pytest.approx(2.495)
    assert webhooks.backoff(30, jitter=0.5) == webhooks.BACKOFF_CAP
    assert webhooks.backoff(10**6) == webhooks.BACKOFF_CAP  # no overflow
    assert all(2.0 <= webhooks.backoff(1) < 2.5 for _ in range(100))
