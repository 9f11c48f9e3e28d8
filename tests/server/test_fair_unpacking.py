"""Per-user fairness of the server itself (issue 29): uploads unpack in a fair queue, a
user holds a bounded number of creates at once, and a batch's copies of its context are
capped. A real server shared by the module, real users, real decompression bombs; the fair
queue's own rules on real threads."""

from __future__ import annotations

import gzip
import io
import socket
import tarfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import httpx
import pytest

from muster.client import pack_context
from muster.errors import TooManyRequests
from muster.server.unpack_queue import FairQueue, next_user
from muster.services.experiments import MAX_ENTRIES_PER_CREATE
from muster.services.uploads import MAX_EXTRACTED_BYTES
from tests.server.experiments import config_text
from tests.server.test_uploads import FORM, form_part
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = pytest.mark.lifecycle  # a real server

MiB = 1024**2
ANSWER_TIMEOUT = 300  # six 1 GiB bombs on a busy machine: a bound on a hang, not a measure
PER_USER = 8  # routes._UNPACKING.per_user

server = shared_server()


@pytest.fixture(scope="module")
def tokens(server: RunningServer) -> dict[str, str]:
    with server.client() as admin:
        return {name: admin.create_user(name, "user")["token"]
                for name in ("alice", "bob", "carol")}


def post(server: RunningServer, token: str, configs: list[str], archive: bytes
         ) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/experiments",
                      headers={"Authorization": f"Bearer {token}"}, timeout=ANSWER_TIMEOUT,
                      data={"config": configs},
                      files={"context": ("context.tar.gz", archive, "application/gzip")})


def slow_bomb(path: Path) -> Path:
    """A tar.gz of 12 files of 100 MiB of zeros (about 1 MiB on disk): each header claims
    less than the limit, so the server unpacks a whole GiB before it refuses the archive.
    Written as `gzip_bomb` writes its one file: the same compressed MiB over and over."""
    compressed_mib = gzip.compress(bytes(MiB))
    with path.open("wb") as out:
        for n in range(MAX_EXTRACTED_BYTES // (100 * MiB) + 2):
            info = tarfile.TarInfo(f"zeros-{n}.bin")
            info.size, info.mode = 100 * MiB, 0o644
            out.write(gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT)))
            out.write(compressed_mib * 100)
        out.write(gzip.compress(bytes(2 * tarfile.BLOCKSIZE)))
    return path


def small_context(tmp_path: Path) -> bytes:
    context = tmp_path / "small"
    context.mkdir(exist_ok=True)
    (context / "train.py").write_text("print('hello')\n")
    return pack_context(context)


def log_lines(server: RunningServer) -> list[str]:
    return (server.home / "server.log").read_text(errors="replace").splitlines()


# U3: six decompression bombs from one user, and another user's normal upload.

@pytest.mark.timeout(2 * ANSWER_TIMEOUT)
def test_one_users_bombs_do_not_hold_back_another_users_upload(
    server: RunningServer, tokens: dict[str, str], tmp_path: Path
) -> None:
    bomb = slow_bomb(tmp_path / "bomb.tar.gz").read_bytes()
    config = config_text(["python", "train.py"])
    finished: list[str] = []
    lock = threading.Lock()

    def upload(who: str, archive: bytes, expected: int) -> Callable[[], None]:
        def send() -> None:
            response = post(server, tokens[who.split("-")[0]], [config], archive)
            with lock:
                finished.append(who)
            assert response.status_code == expected, response.text
        return send

    seen = len(log_lines(server))
    bombs = [threading.Thread(target=upload(f"alice-{n}", bomb, 413)) for n in range(6)]
    for thread in bombs:
        thread.start()
    # Two bombs unpack, four wait: only then does bob upload, behind all four in a FIFO.
    wait_until(lambda: any("context job of alice queued: 4 of theirs waiting" in line
                           for line in log_lines(server)[seen:]),
               timeout=ANSWER_TIMEOUT, what="alice's six bombs to be in the queue")
    bob = threading.Thread(target=upload("bob", small_context(tmp_path), 201))
    bob.start()
    for thread in [*bombs, bob]:
        thread.join(timeout=ANSWER_TIMEOUT)
    assert len(finished) == 7, finished
    # Bob waited for at most one unpack per worker: the bombs queued after them were not
    # his to wait for.
    assert finished.index("bob") < 4, finished


# The bound: a user holds at most PER_USER creates at once, from the moment the body starts.

@pytest.fixture
def held_uploads(server: RunningServer, tokens: dict[str, str]) -> Iterator[list[socket.socket]]:
    """PER_USER uploads of carol's, each stopped half way through its body (held open)."""
    head = (f"POST /api/v1/experiments HTTP/1.1\r\nHost: muster\r\n"
            f"Authorization: Bearer {tokens['carol']}\r\nContent-Type: {FORM}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    part = form_part("context", "context.tar.gz")
    opened: list[socket.socket] = []
    try:
        for _ in range(PER_USER):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=ANSWER_TIMEOUT)
            opened.append(sock)
            sock.sendall(head + b"%x\r\n%s\r\n" % (len(part), part))
        yield opened
    finally:
        for sock in opened:
            sock.close()


def test_a_user_past_their_creates_in_progress_is_told_to_retry(
    server: RunningServer, tokens: dict[str, str], held_uploads: list[socket.socket],
    tmp_path: Path
) -> None:
    config = config_text(["python", "train.py"])

    def refused() -> httpx.Response | None:
        response = post(server, tokens["carol"], [config], small_context(tmp_path))
        return response if response.status_code == 429 else None

    # The held uploads count from when the server starts reading them: wait until it has.
    response = wait_until(refused, timeout=60, what="carol's ninth upload to be refused")
    body = response.json()
    assert body["error"] == "TooManyRequests", body
    assert f"carol already has {PER_USER} experiment creates in progress" in body["message"]
    assert int(response.headers["Retry-After"]) > 0
    assert post(server, tokens["bob"], [config], small_context(tmp_path)).status_code == 201

    for sock in held_uploads:
        sock.close()
    wait_until(lambda: post(server, tokens["carol"], [config],
                            small_context(tmp_path)).status_code == 201,
               timeout=60, what="carol's upload once her held ones were dropped")


def test_the_429_is_in_the_openapi_document(server: RunningServer) -> None:
    document = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    create = document["paths"]["/api/v1/experiments"]["post"]
    assert "Retry-After" in create["responses"]["429"]["headers"]


# Q2: configs x context files, capped per request before any copy is made.

def many_files(count: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for n in range(count):
            info = tarfile.TarInfo(f"f{n}.txt")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        script = b"print('hi')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(script)
        tar.addfile(info, io.BytesIO(script))
    return buffer.getvalue()


def test_a_batch_that_would_copy_its_context_too_often_is_refused_before_any_copy(
    server: RunningServer, tokens: dict[str, str]
) -> None:
    entries = 1_000  # 999 files and train.py
    configs = MAX_ENTRIES_PER_CREATE // entries + 1
    with server.client() as admin:
        listed = [experiment["id"] for experiment in admin.list_experiments()]
    before = sorted((server.home / "experiments").iterdir())
    response = post(server, tokens["bob"], [config_text(["python", "train.py"])] * configs,
                    many_files(entries - 1))
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["error"] == "PayloadTooLarge"
    assert (f"{configs} configs sharing a context of {entries:,} files and directories would "
            f"make {configs * entries:,} of them on the server (a snapshot per experiment), "
            f"over the limit of {MAX_ENTRIES_PER_CREATE:,} per request; send at most "
            f"{MAX_ENTRIES_PER_CREATE // entries} configs per request") in body["message"]
    assert sorted((server.home / "experiments").iterdir()) == before
    with server.client() as admin:
        assert [experiment["id"] for experiment in admin.list_experiments()] == listed


# The fair queue's rules, on real threads.

@pytest.mark.parametrize(("waiting", "running", "served", "chosen"), [
    (["alice"], {"alice": 2}, {"alice": 9}, "alice"),
    (["alice", "bob"], {"alice": 1}, {"alice": 3}, "bob"),  # bob runs nothing: his turn
    (["alice", "bob"], {"alice": 1, "bob": 1}, {"alice": 5, "bob": 4}, "bob"),  # served first
    (["alice", "bob"], {}, {"alice": 2}, "bob"),  # never served (or idle since) goes first
    (["bob", "alice"], {}, {}, "bob"),
])
def test_next_user_is_the_one_running_least_then_served_longest_ago(
    waiting: list[str], running: dict[str, int], served: dict[str, int], chosen: str
) -> None:
    assert next_user(waiting, running, served) == chosen


def blocked(gate: threading.Event, name: str, order: list[str]) -> Callable[[], str]:
    def job() -> str:
        gate.wait(timeout=30)
        order.append(name)
        return name
    return job


def test_a_second_user_runs_before_the_first_users_queued_jobs() -> None:
    queue = FairQueue(workers=1, per_user=8, total=16, name="test-fair")
    gate, order = threading.Event(), []
    futures: list[Future[str]] = [queue.submit("alice", blocked(gate, f"alice-{n}", order))
                                  for n in range(4)]
    futures.append(queue.submit("bob", blocked(gate, "bob", order)))
    gate.set()
    assert [future.result(timeout=30) for future in futures][-1] == "bob"
    assert order == ["alice-0", "bob", "alice-1", "alice-2", "alice-3"]


def test_a_job_that_raises_hands_its_error_to_the_waiter_and_frees_the_worker() -> None:
    queue = FairQueue(workers=1, per_user=8, total=16, name="test-fair")

    def broken() -> None:
        raise ValueError("the archive was bad")

    with pytest.raises(ValueError, match="the archive was bad"):
        queue.submit("alice", broken).result(timeout=30)
    assert queue.submit("alice", lambda: 7).result(timeout=30) == 7


def test_a_job_cancelled_while_it_waits_never_runs() -> None:
    queue = FairQueue(workers=1, per_user=8, total=16, name="test-fair")
    gate, order = threading.Event(), []
    first = queue.submit("alice", blocked(gate, "first", order))
    dropped = queue.submit("alice", blocked(gate, "dropped", order))
    assert dropped.cancel()
    last = queue.submit("alice", blocked(gate, "last", order))
    gate.set()
    assert (first.result(timeout=30), last.result(timeout=30)) == ("first", "last")
    assert order == ["first", "last"]


def test_holding_is_bounded_per_user_and_in_all() -> None:
    queue = FairQueue(workers=1, per_user=2, total=3, name="test-fair")
    with queue.holding("alice"), queue.holding("alice"):
        with pytest.raises(TooManyRequests, match="alice already has 2") as info:
            queue.holding("alice").__enter__()
        assert info.value.retry_after is not None and info.value.retry_after > 0
        with queue.holding("bob"), pytest.raises(TooManyRequests,
                                                 match="the server already has 3"):
            queue.holding("carol").__enter__()
    with queue.holding("alice"), queue.holding("alice"):
        pass  # released: alice may hold two again


def test_a_queue_refuses_bounds_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="per_user=4, total=2"):
        FairQueue(workers=1, per_user=4, total=2, name="test-fair")
