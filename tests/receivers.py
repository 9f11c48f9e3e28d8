"""A real HTTP receiver on a loopback port, for the notification tests: it records every
request (path, headers, body), answers each path with the statuses it is told to (then 200),
can hold a path's first request until released, and acts once per `Idempotency-Key` (what a
receiver that honours the key does: a repeat is answered 200 and not acted on again)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

MAX_BODY = 1 << 20
HOLD_LIMIT_S = 120.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what it was answered (0: never: the sender went away while held)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def key(self) -> str | None:
        return self.headers.get("idempotency-key")


class Receiver:
    def __init__(self) -> None:
        self.got: list[Received] = []
        self.acted: dict[str, bytes] = {}  # idempotency key -> the body it acted on, once
        self._statuses: dict[str, list[int]] = {}
        self._holds: dict[str, threading.Event] = {}
        self._held: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._take(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the tests read `got`, not stderr

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, path: str, *statuses: int) -> None:
        """Answer the next requests to `path` with `statuses`, in order; then 200."""
        with self._lock:
            self._statuses[path] = list(statuses)

    def hold(self, path: str) -> threading.Event:
        """Hold the first request to `path` unanswered until the returned event is set;
        `held(path)` is set once that request is in."""
        with self._lock:
            self._holds[path] = threading.Event()
            self._held[path] = threading.Event()
            return self._holds[path]

    def held(self, path: str) -> threading.Event:
        return self._held[path]

    def at(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.got if r.path == path]

    def _take(self, handler: BaseHTTPRequestHandler) -> None:
        length = min(int(handler.headers.get("content-length") or 0), MAX_BODY)
        body = handler.rfile.read(length)
        path = handler.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self._lock:
            hold = self._holds.pop(path, None)
            held = self._held.get(path)
            statuses = self._statuses.get(path)
            status = statuses.pop(0) if statuses else 200
        if hold is not None and held is not None:
            held.set()
            hold.wait(HOLD_LIMIT_S)
            with self._lock:
                self.got.append(Received(path, headers, body, 0))
            return  # never answered: the sender was killed meanwhile
        key = headers.get("idempotency-key")
        with self._lock:
            self.got.append(Received(path, headers, body, status))
            if 200 <= status < 300 and key is not None:
                self.acted.setdefault(key, body)  # a repeat of a key is not acted on
        try:
            handler.send_response(status)
            handler.send_header("Content-Length", "2")
            handler.end_headers()
            handler.wfile.write(b"ok")
        except OSError:
            pass  # the sender went away: what it does next is what is tested

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for event in list(self._holds.values()):
            event.set()
        self._server.shutdown()
        self._server.server_close()
