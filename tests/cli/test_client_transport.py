"""The SDK's plain calls (`muster.http_transport` under `muster.client.Client`): against a
real server (threads, a restart), and against a real socket that misbehaves as servers and
networks do (drops a kept-alive connection, answers too slowly, answers an error in HTML,
refuses an upload before reading it), over http, https and proxies.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from muster import errors
from muster.client import Client
from muster.home import Home
from tests.server.experiments import make_context, submit, wait_ended
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

# -- a server that misbehaves on cue ---------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request as the scripted server read it."""

    connection: int  # the n-th connection accepted, from 0
    order: int  # the n-th request on its connection, from 0
    method: str
    target: str
    headers: dict[str, str]  # names in lower case
    body: bytes


Answer = Callable[[Seen], bytes | None]  # the bytes to send back; None: hang up instead


def reply(status: int, body: bytes = b'{"ok": true}', content_type: str = "application/json",
          reason: str = "") -> bytes:
    reason = reason or {200: "OK", 404: "Not Found", 502: "Bad Gateway"}.get(status, "Status")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


@dataclass
class ScriptedServer:
    """A real listening socket on 127.0.0.1 that answers each request as `answer` says,
    one thread per connection (closed after one answer with `hang_up_after_answer`, as an
    idle server does; with `reads_bodies` False, answered before its body is read, as a
    server refusing an upload does); it records what it was sent."""

    answer: Answer
    tls: ssl.SSLContext | None = None
    hang_up_after_answer: bool = False
    reads_bodies: bool = True
    seen: list[Seen] = field(default_factory=list)
    accepted: int = 0
    hung_up: int = 0  # connections it closed
    _listener: socket.socket = field(default_factory=socket.socket)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> None:
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # stopped
            number, self.accepted = self.accepted, self.accepted + 1
            threading.Thread(target=self._serve, args=(sock, number), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            stream = sock.makefile("rb")
            order = 0
            while (request := _read_request(stream, number, order,
                                            self.reads_bodies)) is not None:
                self.seen.append(request)
                answer = self.answer(request)
                if answer is None:
                    break
                sock.sendall(answer)
                if self.hang_up_after_answer:
                    break
                order += 1
        except OSError:
            pass  # the client went away, or refused our certificate
        finally:
            sock.close()
            self.hung_up += 1


def _read_request(stream: Any, connection: int, order: int, body: bool) -> Seen | None:
    line = stream.readline()
    if not line:
        return None
    method, target, _ = line.decode().split(" ", 2)
    headers = {}
    while (header := stream.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    content = stream.read(int(headers.get("content-length", 0))) if body else b""
    return Seen(connection, order, method, target, headers, content)


@pytest.fixture
def scripted() -> Iterator[Callable[..., ScriptedServer]]:
    """Start scripted servers: `scripted(answer, **options)` (ScriptedServer's fields)."""
    started: list[ScriptedServer] = []

    def start(answer: Answer, **options: Any) -> ScriptedServer:
        server = ScriptedServer(answer, **options)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def client_of(server: ScriptedServer, tmp_path: Path, timeout: float = 30.0) -> Client:
    return Client(url=server.url, token="t0k", home=Home(tmp_path / "home"), timeout=timeout)


def always_ok(request: Seen) -> bytes:
    return reply(200)


# -- keep-alive, and a connection dropped under a request -----------------------------


def test_calls_share_one_kept_alive_connection(scripted: Any, tmp_path: Path) -> None:
    server = scripted(always_ok)
    with client_of(server, tmp_path) as client:
        for _ in range(3):
            assert client.health() == {"ok": True}
    assert len(server.seen) == 3 and server.accepted == 1


@pytest.fixture
def dropping(scripted: Any) -> ScriptedServer:
    """Answers a connection's first request, and hangs up on the next one, as a server does
    that closes an idle connection just as a request goes out on it."""
    server: ScriptedServer = scripted(lambda request: reply(200) if request.order == 0
                                      else None)
    return server


def test_a_get_on_a_dropped_kept_alive_connection_is_sent_again(
    dropping: ScriptedServer, tmp_path: Path
) -> None:
    with client_of(dropping, tmp_path) as client:
        assert client.health() == {"ok": True}
        assert client.get_experiment(7) == {"ok": True}  # dropped, then sent again
    assert [(s.connection, s.target) for s in dropping.seen] == [
        (0, "/api/v1/health"), (0, "/api/v1/experiments/7"), (1, "/api/v1/experiments/7")]


def test_a_post_on_a_dropped_connection_is_reported_not_sent_again(
    dropping: ScriptedServer, tmp_path: Path
) -> None:
    with client_of(dropping, tmp_path) as client:
        client.health()
        with pytest.raises(errors.ServerUnavailable) as raised:
            client.set_trial_priority(3, 5)
    assert str(raised.value) == (
        f"muster server at {dropping.url}: the server closed the connection as a POST to "
        "/api/v1/trials/3/priority went out (the server closed the connection without "
        "answering); it may or may not have done it: check before you send it again")
    assert [s.method for s in dropping.seen] == ["GET", "POST"]


def test_a_connection_the_server_closed_while_idle_is_not_reused(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(always_ok, hang_up_after_answer=True)
    with client_of(server, tmp_path) as client:
        client.health()
        wait_until(lambda: server.hung_up == 1, what="the server to close the connection")
        assert client.set_trial_priority(3, 5) == {"ok": True}  # a POST: never sent twice
    assert [(s.connection, s.method) for s in server.seen] == [(0, "GET"), (1, "POST")]


# -- timeouts, unreachable servers, error answers ------------------------------------


def test_an_upload_refused_before_it_is_read_gets_the_servers_answer(
    scripted: Any, tmp_path: Path
) -> None:
    too_large = b'{"message": "the request is larger than 1 MiB"}'
    server = scripted(lambda request: reply(413, too_large, reason="Payload Too Large"),
                      reads_bodies=False, hang_up_after_answer=True)
    context = tmp_path / "context"
    context.mkdir()
    (context / "data.bin").write_bytes(os.urandom(16 * 1024**2))  # more than socket buffers
    with client_of(server, tmp_path) as client, pytest.raises(errors.PayloadTooLarge) as raised:
        client.create_experiment("name: big\n", context)
    assert str(raised.value) == "the request is larger than 1 MiB"
    assert len(server.seen) == 1  # a POST: not sent again


def test_an_answer_slower_than_the_timeout_is_reported_once(
    scripted: Any, tmp_path: Path
) -> None:
    answer = threading.Event()  # the server answers only once the client has given up

    def slow(request: Seen) -> bytes:
        answer.wait(60)
        return reply(200)

    server = scripted(slow)
    try:
        with client_of(server, tmp_path, timeout=0.5) as client, \
                pytest.raises(errors.ServerUnavailable) as raised:
            client.list_experiments()
    finally:
        answer.set()
    assert str(raised.value) == (
        f"cannot reach the muster server at {server.url} (timed out); start it with "
        "`muster up --detach` or set MUSTER_URL")
    assert len(server.seen) == 1  # a timeout is not a dropped connection: not sent again


def test_an_unreachable_server_says_how_to_start_one(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
        with Client(url=url, token="t", home=Home(tmp_path)) as client, \
                pytest.raises(errors.ServerUnavailable) as raised:
            client.list_jobs()
    assert str(raised.value) == (
        f"cannot reach the muster server at {url} ([Errno 111] Connection refused); start it "
        "with `muster up --detach` or set MUSTER_URL")


def test_a_url_without_a_scheme_is_refused_as_unreachable(tmp_path: Path) -> None:
    with Client(url="localhost:8080", token="t", home=Home(tmp_path)) as client, \
            pytest.raises(errors.ServerUnavailable, match="must start with http:// or https://"):
        client.health()


@pytest.mark.parametrize(("answer", "raised", "message"), [
    (reply(502, b"<html>Bad Gateway</html>", "text/html"), errors.ServerError,
     "server error (502): <html>Bad Gateway</html>"),
    (reply(404, b""), errors.NotFound, "Not Found"),
    (reply(503, b"database is locked", "text/plain"), errors.StoreError,
     "server error (503): database is locked"),
    (reply(422, b'{"message": "bad config (name)"}'), errors.ConfigError, "bad config (name)"),
    (reply(418, b'{"no": "message"}', reason="I'm a teapot"), errors.MusterError,
     '{"no": "message"}'),
])
def test_an_error_answer_becomes_the_error_of_its_status(
    scripted: Any, tmp_path: Path, answer: bytes, raised: type[errors.MusterError],
    message: str,
) -> None:
    server = scripted(lambda request: answer)
    with client_of(server, tmp_path) as client, pytest.raises(raised) as caught:
        client.get_experiment(1)
    assert type(caught.value) is raised and str(caught.value) == message


def test_a_401_names_the_token_that_was_sent(scripted: Any, tmp_path: Path) -> None:
    server = scripted(lambda request: reply(401, b'{"message": "unknown token"}',
                                            reason="Unauthorized"))
    with client_of(server, tmp_path) as client, pytest.raises(errors.Unauthorized) as caught:
        client.whoami()
    assert str(caught.value) == "unknown token (sent the token given)"


# -- what a request sends ------------------------------------------------------------


def test_a_request_sends_its_query_body_and_token(scripted: Any, tmp_path: Path) -> None:
    server = scripted(always_ok)
    with Client(url=server.url + "/muster/", token="t0k", home=Home(tmp_path)) as client:
        client.list_experiments(owner="ann lee", mine=True, limit=5)
        client.set_trial_priority(3, 5)
        client.edit_user("ann", display_name="Ann Lée")
        client.release_node("gpu node/1")
        client.delete_experiment(4)
    listed, priority, edited, released, deleted = server.seen
    assert listed.target == "/muster/api/v1/experiments?owner=ann+lee&mine=true&limit=5"
    assert listed.headers["authorization"] == "Bearer t0k"
    assert "content-length" not in listed.headers and listed.body == b""
    assert (priority.method, priority.headers["content-type"]) == ("POST", "application/json")
    assert json.loads(priority.body) == {"priority": 5}
    assert edited.method == "PATCH"
    assert json.loads(edited.body.decode()) == {"display_name": "Ann Lée"}
    assert released.target == "/muster/api/v1/cluster/nodes/gpu%20node%2F1/release"
    assert (deleted.method, deleted.target) == ("DELETE", "/muster/api/v1/experiments/4")


# -- proxies from the environment ----------------------------------------------------


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment with no proxy in it: each test names its own."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_an_http_proxy_is_sent_the_whole_url_and_its_user(
    scripted: Any, tmp_path: Path, no_proxies: pytest.MonkeyPatch
) -> None:
    proxy = scripted(always_ok)
    no_proxies.setenv("HTTP_PROXY", proxy.url.replace("//", "//ann:s%40cret@"))
    with Client(url="http://muster.invalid:8080", token="t", home=Home(tmp_path)) as client:
        assert client.get_trial(7) == {"ok": True}
    [seen] = proxy.seen
    assert seen.target == "http://muster.invalid:8080/api/v1/trials/7"
    assert seen.headers["proxy-authorization"] == "Basic YW5uOnNAY3JldA=="  # ann:s@cret


def test_no_proxy_exempts_a_server(
    scripted: Any, tmp_path: Path, no_proxies: pytest.MonkeyPatch
) -> None:
    server = scripted(always_ok)
    no_proxies.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    no_proxies.setenv("no_proxy", "localhost,127.0.0.1")
    with client_of(server, tmp_path) as client:
        assert client.health() == {"ok": True}


def test_an_https_server_is_reached_through_a_proxys_tunnel(
    scripted: Any, tmp_path: Path, no_proxies: pytest.MonkeyPatch
) -> None:
    proxy = scripted(lambda request: reply(403, b"", reason="Forbidden"))
    no_proxies.setenv("ALL_PROXY", proxy.url)
    with Client(url="https://muster.invalid", token="t", home=Home(tmp_path)) as client, \
            pytest.raises(errors.ServerUnavailable, match="Tunnel connection failed: 403"):
        client.health()
    assert [(s.method, s.target) for s in proxy.seen] == [("CONNECT", "muster.invalid:443")]


# -- https -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (made by `openssl`) and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("needs the openssl command to make a certificate")
    return cert, key


@pytest.fixture
def https_server(scripted: Any, certificate: tuple[Path, Path]) -> ScriptedServer:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(*certificate)
    server: ScriptedServer = scripted(always_ok, tls=tls)
    return server


def test_https_verifies_the_certificate_and_keeps_the_connection(
    https_server: ScriptedServer, certificate: tuple[Path, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # trust it, as a site's CA
    with client_of(https_server, tmp_path) as client:
        assert client.health() == client.whoami() == {"ok": True}
    assert https_server.accepted == 1


def test_https_refuses_a_certificate_nobody_vouches_for(
    https_server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with client_of(https_server, tmp_path) as client, \
            pytest.raises(errors.ServerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        client.health()
    assert https_server.seen == []


# -- against a real server -------------------------------------------------------------


def test_plain_calls_against_a_real_server(client: Client, tmp_path: Path) -> None:
    context = make_context(tmp_path, "exit0.sh", name="plain-calls")
    created = submit(client, context)  # a multipart upload: the config and the context
    again = client.create_experiment((context / "experiment.yaml").read_text(), None,
                                     context_from=int(created["id"]))  # a form, no files
    pair = client.create_experiments(
        [(context / "experiment.yaml").read_text()] * 2, context)  # a repeated field
    ids = [int(exp["id"]) for exp in (created, again, *pair)]
    assert len(set(ids)) == 4
    assert wait_ended(client, ids[1])["state"] == "COMPLETED"
    listed = client.list_experiments(name="plain-calls", sort="id", descending=True)
    assert [exp["id"] for exp in listed] == sorted(ids, reverse=True)
    with pytest.raises(errors.NotFound):
        client.get_experiment(10**9)


def test_a_wrong_token_is_named_in_the_error(server: RunningServer) -> None:
    with Client(url=server.url, token="not-a-token", home=Home(server.home)) as wrong, \
            pytest.raises(errors.Unauthorized, match=r"\(sent the token given\)$"):
        wrong.list_experiments()


def test_one_client_serves_several_threads(client: Client, tmp_path: Path) -> None:
    # Each answer is whole and the same list (an earlier test's experiments may still be
    # running: their states and verdict counts change meanwhile, their ids and names not).
    # One experiment of its own, so the list is not empty whichever tests ran before.
    (tmp_path / "run.py").write_text("pass\n")
    client.create_experiment("name: threads\nentrypoint: python run.py\n", tmp_path)

    def listed() -> list[tuple[Any, Any]]:
        return [(exp["id"], exp["name"]) for exp in client.list_experiments()]

    expected = listed()

    def calls(_: int) -> list[Any]:
        return [listed() for _ in range(20)]

    with ThreadPoolExecutor(4) as pool:
        answers = [answer for batch in pool.map(calls, range(4)) for answer in batch]
    assert len(answers) == 80 and all(answer == expected for answer in answers)
    assert expected


def test_a_restarted_server_is_reached_again(tmp_path: Path) -> None:
    with serving(tmp_path / "home") as server, server.client() as client:
        client.health()
        server.kill()
        with pytest.raises(errors.ServerUnavailable, match="cannot reach the muster server"):
            client.list_experiments()
        server.start()
        assert client.list_experiments() == []
