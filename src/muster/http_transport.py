"""The SDK's plain HTTP calls, on the standard library: a request with a query, a JSON, form
or multipart body and headers in, the whole answer (status, headers, body) out.

Why not httpx here: importing it costs a CLI command that makes one call about 120 ms, a
third of `muster experiment list`; `http.client` costs a fraction of that. The client still
uses httpx, imported when first needed, for what streams (follows, downloads).

How it behaves (as httpx did for these calls, unless it says otherwise):
- Keep-alive: finished connections wait in a pool (`Transport` may be shared by threads;
  each request has a connection to itself) and are dropped after KEEPALIVE_S idle, or when
  the server has closed them (seen before reuse).
- Timeouts: `timeout` seconds to connect and for each read and write (a body is written in
  WRITE_CHUNK pieces, so a large upload on a slow link is not one timed write).
- A kept-alive connection the server closed as the request went out (httpx raised): a
  GET, PUT, DELETE (idempotent) is sent again once on a new connection; another method
  raises `BrokenOff`, as the server may have acted on it.
- https verifies the server's certificate with `ssl.create_default_context()`: the
  system's CAs, or $SSL_CERT_FILE / $SSL_CERT_DIR (httpx: certifi's CAs, or those).
- A proxy named by $HTTP_PROXY, $HTTPS_PROXY or $ALL_PROXY (any case) is used unless
  $NO_PROXY exempts the server: an http:// proxy, CONNECT for an https server.
- No redirects are followed; cookies are not kept (the client sends a login's back).
"""

from __future__ import annotations

import http.client
import json as jsonlib
import os
import select
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, quote, unquote, urlencode, urlsplit

from muster import __version__

KEEPALIVE_S = 5.0  # httpx's keep-alive expiry; uvicorn closes idle connections after 5 s
MAX_IDLE = 20  # idle connections kept per transport (httpx's max_keepalive_connections)
WRITE_CHUNK = 64 * 1024
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_PATH_SAFE = "/:@!$&'()*+,;=%~"  # what stays as written in a path (RFC 3986 pchar, and %XX)

Connection = http.client.HTTPConnection  # or its HTTPSConnection subclass
NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})  # no Content-Length: 0
File = tuple[str, bytes, str]  # a multipart file: its file name, its bytes, its media type


class TransportError(Exception):
    """The request got no answer: the server could not be reached, or took longer than the
    timeout. The message is the cause, e.g. `[Errno 111] Connection refused`."""


class BrokenOff(TransportError):
    """The server closed a kept-alive connection as a request that is not idempotent went
    out: it may or may not have acted on it."""


@dataclass(frozen=True)
class Response:
    """A whole answer; the names are httpx.Response's, which `muster.client` also reads."""

    status_code: int
    reason_phrase: str
    headers: http.client.HTTPMessage  # case-insensitive `get`; `get_all` for repeats
    content: bytes

    @property
    def text(self) -> str:
        charset = self.headers.get_content_charset() or "utf-8"
        try:
            return self.content.decode(charset, errors="replace")
        except LookupError:
            return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)


@dataclass(frozen=True)
class Body:
    """What a request sends: its content headers and its bytes, in pieces."""

    headers: dict[str, str]
    pieces: tuple[bytes | memoryview, ...] = ()

    @property
    def length(self) -> int:
        return sum(len(piece) for piece in self.pieces)


NO_BODY = Body({})


def encode_body(json: Any = None, data: Mapping[str, Any] | None = None,
                files: Mapping[str, File] | None = None) -> Body:
    """The body of a request, as httpx encodes `json=`, `data=` and `files=`: JSON; a form
    (urlencoded); with files, multipart/form-data. A list in `data` is a repeated field."""
    if json is not None:
        text = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return Body({"Content-Type": "application/json"}, (text.encode(),))
    if files:
        return _multipart(data or {}, files, os.urandom(16).hex())
    if data:
        return Body({"Content-Type": "application/x-www-form-urlencoded"},
                    (urlencode(_form_pairs(data)).encode(),))
    return Body({})


def encode_target(prefix: str, path: str, params: Mapping[str, Any] | None) -> str:
    """The request target: the base URL's path, `path` (characters a path cannot hold
    percent-encoded) and the query. True/False go as "true"/"false", a list repeats."""
    target = quote(prefix + path, safe=_PATH_SAFE)
    query = urlencode(_form_pairs(params or {}))
    return f"{target}?{query}" if query else target


def _form_pairs(fields: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for name, value in fields.items():
        for one in value if isinstance(value, list | tuple) else [value]:
            pairs.append((name, _form_value(one)))
    return pairs


def _form_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _multipart(data: Mapping[str, Any], files: Mapping[str, File], boundary: str) -> Body:
    pieces: list[bytes | memoryview] = []
    for name, value in _form_pairs(data):
        pieces += [_part_head(boundary, name), value.encode(), b"\r\n"]
    for name, (filename, content, content_type) in files.items():
        pieces.append(_part_head(boundary, name, filename, content_type))
        view = memoryview(content)
        pieces += [view[i:i + WRITE_CHUNK] for i in range(0, len(view), WRITE_CHUNK)]
        pieces.append(b"\r\n")
    pieces.append(f"--{boundary}--\r\n".encode())
    return Body({"Content-Type": f"multipart/form-data; boundary={boundary}"}, tuple(pieces))


def _part_head(boundary: str, name: str, filename: str | None = None,
               content_type: str | None = None) -> bytes:
    disposition = f'form-data; name="{_quoted(name)}"'
    if filename is not None:
        disposition += f'; filename="{_quoted(filename)}"'
    head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    return (head + "\r\n").encode()


def _quoted(name: str) -> str:
    """A field or file name inside a quoted string (the HTML form rule httpx follows)."""
    return name.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace(
        "\n", "%0A")


class Transport:
    """Sends requests to one server (`base_url`: http:// or https://, perhaps with a path)
    over kept-alive connections; safe to share between threads."""

    def __init__(self, base_url: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url
        self.timeout = timeout
        self._scheme = parts.scheme
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._pool = _Pool()
        # Only an https server needs a TLS context (reading the CAs is not free).
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._server = parts

    @property
    def tls_context(self) -> ssl.SSLContext | None:
        """How an https server's certificate is checked (None for http)."""
        return self._tls

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None, body: Body = NO_BODY) -> Response:
        """Send one request and read the whole answer.

        Raises:
            TransportError: no answer (unreachable, refused, timed out, TLS failed).
            BrokenOff: a kept-alive connection closed under a request not idempotent.
        """
        proxy = proxy_for(self._server)
        target, sent = self._head(method, path, params, headers or {}, body, proxy)
        connection, reused = self._connection(proxy, fresh=False)
        try:
            return self._exchange(connection, method, target, sent, body)
        except ConnectionError as exc:
            if not reused:
                raise TransportError(_cause(exc)) from exc
            if method not in IDEMPOTENT:
                raise BrokenOff(
                    f"the server closed the connection as a {method} to {target} went out "
                    f"({_cause(exc)}); it may or may not have done it: check before you "
                    "send it again") from exc
        connection, _ = self._connection(proxy, fresh=True)  # a kept-alive one was dropped
        try:
            return self._exchange(connection, method, target, sent, body)
        except ConnectionError as exc:
            raise TransportError(_cause(exc)) from exc

    def _head(self, method: str, path: str, params: Mapping[str, Any] | None,
              headers: Mapping[str, str], body: Body, proxy: Proxy | None
              ) -> tuple[str, dict[str, str]]:
        """The request's target and headers."""
        target = encode_target(self._prefix, path, params)
        sent = {"User-Agent": f"muster/{__version__}", "Accept": "*/*", **body.headers,
                **headers, "Content-Length": str(body.length)}
        if not body.pieces and method in NO_BODY_METHODS:
            del sent["Content-Length"]
        if proxy is not None and self._scheme == "http":  # the proxy needs the whole URL
            target = f"http://{self._server.netloc.rpartition('@')[2]}{target}"
            sent.update(proxy.authorization)
        return target, sent

    def close(self) -> None:
        """Close the idle connections, and each one in use when its answer has been read;
        later requests still work, each on a connection of its own."""
        self._pool.close()

    def _connection(self, proxy: Proxy | None, fresh: bool) -> tuple[Connection, bool]:
        """(a connection, whether it is a kept-alive one): from the pool unless `fresh`."""
        if not fresh and (idle := self._pool.take()) is not None:
            return idle, True
        host, port = ((proxy.host, proxy.port) if proxy is not None
                      else (self._host, self._port))
        if self._scheme == "http":
            return http.client.HTTPConnection(host, port, timeout=self.timeout), False
        if self._scheme != "https":
            raise TransportError(
                f"the URL {self.base_url!r} must start with http:// or https://")
        connection = http.client.HTTPSConnection(host, port, timeout=self.timeout,
                                                 context=self._tls)
        if proxy is not None:
            connection.set_tunnel(self._host, self._port, headers=proxy.authorization)
        return connection, False

    def _exchange(self, connection: Connection, method: str, target: str,
                  headers: dict[str, str], body: Body) -> Response:
        """Send on `connection`, read the answer, and put the connection back in the pool
        when it may be used again. ConnectionError: it broke before any answer came."""
        try:
            sent_all = _send(connection, method, target, headers, body)
            answer = connection.getresponse()
            response = Response(answer.status, answer.reason, answer.headers, answer.read())
        except ConnectionError:
            connection.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise TransportError(_cause(exc)) from exc
        if answer.will_close or not sent_all:
            connection.close()
        else:
            self._pool.give_back(connection)
        return response


def _send(connection: Connection, method: str, target: str, headers: dict[str, str],
          body: Body) -> bool:
    """Send the request; False if the server stopped taking its body. A server may answer
    before it has read the whole body (a 413 to a large upload) and close the connection:
    that answer is still read, as httpx does."""
    try:
        connection.request(method, target, body=body.pieces or None, headers=headers)
    except ConnectionError:
        if connection.sock is None:  # never connected
            raise
        return False
    return True


@dataclass(frozen=True)
class Proxy:
    """An http:// proxy: where it listens, and what to tell it of who we are."""

    host: str
    port: int
    authorization: dict[str, str]  # Proxy-Authorization, when its URL has a user


def proxy_for(server: SplitResult) -> Proxy | None:
    """The proxy the environment names for `server` ($HTTP_PROXY, $HTTPS_PROXY, $ALL_PROXY,
    any case), unless $NO_PROXY exempts it; read as httpx reads them.

    Raises:
        TransportError: the proxy is not an http:// one.
    """
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return None  # the common case, without importing urllib.request
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    named = proxies.get(server.scheme) or proxies.get("all")
    if not named or urllib.request.proxy_bypass(server.hostname or ""):
        return None
    proxy = urlsplit(named if "://" in named else f"http://{named}")
    if proxy.scheme != "http":
        raise TransportError(f"the proxy {named!r} the environment names is not an http:// "
                             "one, the only kind muster's client takes")
    authorization = {}
    if proxy.username is not None:
        import base64

        user = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        authorization["Proxy-Authorization"] = "Basic " + base64.b64encode(
            user.encode()).decode()
    return Proxy(proxy.hostname or "", proxy.port or 80, authorization)


def _cause(exc: BaseException) -> str:
    """What went wrong, in words: `timed out`, `[Errno 111] Connection refused`."""
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(exc, http.client.IncompleteRead):
        return f"the answer broke off after {len(exc.partial)} bytes"
    return str(exc) or type(exc).__name__


class _Pool:
    """The idle connections of a transport, newest last; a lock keeps threads apart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[Connection, float]] = []
        self._closed = False

    def take(self) -> Connection | None:
        """The most recently used idle connection the server has not closed, if any."""
        with self._lock:
            while self._idle:
                connection, since = self._idle.pop()
                if time.monotonic() - since < KEEPALIVE_S and not _closed_by_peer(connection):
                    return connection
                connection.close()
        return None

    def give_back(self, connection: Connection) -> None:
        with self._lock:
            if self._closed:
                surplus = [(connection, 0.0)]
            else:
                self._idle.append((connection, time.monotonic()))
                surplus = self._idle[:-MAX_IDLE]
                del self._idle[:-MAX_IDLE]
        for old, _ in surplus:
            old.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for connection, _ in idle:
            connection.close()


def _closed_by_peer(connection: Connection) -> bool:
    """Whether an idle connection can be read from: the server has closed it (or sent what
    no request asked for), so it must not carry another request."""
    if connection.sock is None:
        return True
    poller = select.poll()  # not select.select: it fails on descriptors past 1023
    poller.register(connection.sock, select.POLLIN)
    return bool(poller.poll(0))
