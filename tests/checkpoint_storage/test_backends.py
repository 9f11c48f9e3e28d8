"""One contract suite for every storage backend (`muster.checkpoint_storage.base`), run against
shared_fs on a temporary directory and S3 on moto's real S3 API; no mocks."""

from __future__ import annotations

import errno
import hashlib
import http.server
import io
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from muster.checkpoint_storage.base import Backend, ObjectMissing
from muster.checkpoint_storage.s3 import S3
from muster.checkpoint_storage.shared_fs import HashingReader, SharedFs
from muster.errors import StorageError

from .conftest import PART

BIG = 12 << 20  # three 5 MiB parts on S3 (5, 5, 2)
BAD_KEYS = ["", "/abs", "a/../b", "..", "a//b", "a/", ".", "a/./b", "a\0b", ".tmp-1-x",
            "a/.tmp-1-x"]


def write_random(path: Path, size: int) -> str:
    """Fill `path` with `size` random bytes; their sha256 hex digest."""
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def keys(backend: Backend, prefix: str = "") -> list[str]:
    return sorted(o.key for o in backend.list(prefix))


@pytest.mark.parametrize("size", [0, 1000, BIG], ids=["empty", "small", "multipart"])
def test_put_and_get_file_round_trip_with_sha256(backend: Backend, tmp_path: Path,
                                                 size: int) -> None:
    digest = write_random(tmp_path / "src", size)

    assert backend.put_file("c1/model.pt", tmp_path / "src") == digest
    assert backend.get_file("c1/model.pt", tmp_path / "copy") == digest
    assert (tmp_path / "copy").read_bytes() == (tmp_path / "src").read_bytes()
    assert backend.exists("c1/model.pt")
    [stored] = backend.list("c1/")
    assert (stored.key, stored.size) == ("c1/model.pt", size)
    assert abs(stored.modified_at - time.time()) < 300


def test_s3_sends_a_big_file_in_parts_with_checksums(s3: S3, s3_client: Any, s3_bucket: str,
                                                     tmp_path: Path) -> None:
    digest = write_random(tmp_path / "src", BIG)
    assert s3.put_file("c1/model.pt", tmp_path / "src") == digest  # of the bytes sent

    head = s3_client.head_object(Bucket=s3_bucket, Key="ckpt/c1/model.pt", ChecksumMode="ENABLED")
    assert head["ETag"].endswith('-3"')  # three parts
    assert head["ContentLength"] == BIG
    assert any(head.get(f"Checksum{kind}") for kind in ("CRC32", "CRC64NVME", "CRC32C")), head


def test_put_file_replaces_an_object(backend: Backend, tmp_path: Path) -> None:
    backend.put_bytes("c1/a", b"old")
    digest = write_random(tmp_path / "src", 100)

    assert backend.put_file("c1/a", tmp_path / "src") == digest
    assert backend.get_bytes("c1/a", 1000) == (tmp_path / "src").read_bytes()


def test_put_bytes_create_once_writes_only_the_first_time(backend: Backend) -> None:
    assert backend.put_bytes("c1/metadata.json", b"first", create_once=True) is True
    assert backend.put_bytes("c1/metadata.json", b"second", create_once=True) is False
    assert backend.get_bytes("c1/metadata.json", 100) == b"first"

    assert backend.put_bytes("c1/metadata.json", b"third") is True
    assert backend.get_bytes("c1/metadata.json", 100) == b"third"


def test_a_missing_key_is_object_missing(backend: Backend, tmp_path: Path) -> None:
    backend.put_bytes("c1/a", b"x")

    with pytest.raises(ObjectMissing, match=r"c1/nope"):
        backend.get_file("c1/nope", tmp_path / "copy")
    with pytest.raises(ObjectMissing):
        backend.get_bytes("c2/a", 100)
    with pytest.raises(ObjectMissing):
        backend.get_bytes("c1/a/deeper", 100)
    with pytest.raises(ObjectMissing):
        backend.get_bytes("c1", 100)  # a prefix is not an object
    assert not (tmp_path / "copy").exists()
    assert not backend.exists("c1/nope")
    assert not backend.exists("c1")


def test_get_bytes_refuses_an_object_over_max_bytes(backend: Backend) -> None:
    backend.put_bytes("c1/a", b"0123456789")

    assert backend.get_bytes("c1/a", 10) == b"0123456789"
    with pytest.raises(StorageError, match=r"10 bytes, more than the 9") as caught:
        backend.get_bytes("c1/a", 9)
    assert not isinstance(caught.value, ObjectMissing)
    assert backend.url("c1/a") in str(caught.value)


def test_get_file_never_overwrites_dest(backend: Backend, tmp_path: Path) -> None:
    backend.put_bytes("c1/a", b"stored")
    (tmp_path / "dest").write_bytes(b"mine")

    with pytest.raises(StorageError, match=r"File exists"):
        backend.get_file("c1/a", tmp_path / "dest")
    assert (tmp_path / "dest").read_bytes() == b"mine"


def test_list_and_children(backend: Backend) -> None:
    for key in ["u1/metadata.json", "u1/state/model.pt", "u10/a", "u2/a", "top"]:
        backend.put_bytes(key, key.encode())

    assert keys(backend) == ["top", "u1/metadata.json", "u1/state/model.pt", "u10/a", "u2/a"]
    assert keys(backend, "u1/") == ["u1/metadata.json", "u1/state/model.pt"]
    assert keys(backend, "u1") == ["u1/metadata.json", "u1/state/model.pt", "u10/a"]
    assert keys(backend, "u1/state/") == ["u1/state/model.pt"]
    assert keys(backend, "u3/") == []
    assert sorted(backend.children()) == ["top", "u1", "u10", "u2"]
    assert {o.key: o.size for o in backend.list("u2/")} == {"u2/a": 4}


def test_an_empty_storage_lists_nothing(backend: Backend) -> None:
    assert keys(backend) == []
    assert list(backend.children()) == []
    assert backend.open_uploads() == []


def test_delete_in_order_and_again_and_missing(backend: Backend) -> None:
    for key in ["u1/metadata.json", "u1/state/model.pt", "u2/a"]:
        backend.put_bytes(key, b"x")

    backend.delete(["u1/metadata.json", "u1/state/model.pt", "u1/never-there"])
    assert keys(backend) == ["u2/a"]
    assert list(backend.children()) == ["u2"]
    backend.delete(["u1/metadata.json", "u1/state/model.pt"])
    backend.delete(["u2", "u2/a/b"])  # a prefix is not an object; nor is a path below one
    assert keys(backend) == ["u2/a"]
    backend.delete(["u2/a", "u2/a"])
    assert keys(backend) == []
    assert list(backend.children()) == []


def test_delete_checks_every_key_before_deleting_any(backend: Backend) -> None:
    backend.put_bytes("u1/a", b"x")

    with pytest.raises(StorageError, match=r"invalid storage key"):
        backend.delete(["u1/a", "u1/../u2"])
    assert keys(backend) == ["u1/a"]


def test_open_uploads_shows_an_abandoned_write_until_aborted(
        backend: Backend, abandon_upload: Callable[[str], None]) -> None:
    backend.put_bytes("u1/metadata.json", b"x")
    abandon_upload("u1/state/model.pt")
    abandon_upload("u2/model.pt")

    uploads = sorted(backend.open_uploads(), key=lambda u: u.key)
    assert [u.key for u in uploads] == ["u1/state/model.pt", "u2/model.pt"]
    assert all(u.upload_id and u.started_at > 0 for u in uploads)
    assert keys(backend) == ["u1/metadata.json"]  # never visible as objects
    assert list(backend.children()) == ["u1"]
    assert not backend.exists("u2/model.pt")

    for upload in uploads:
        backend.abort_upload(upload)
    backend.abort_upload(uploads[0])  # already gone is done
    assert backend.open_uploads() == []
    assert keys(backend) == ["u1/metadata.json"]


def test_shared_fs_open_upload_is_the_temporary_file(shared_fs: SharedFs,
                                                     tmp_path: Path) -> None:
    (tmp_path / "storage" / "u1").mkdir(parents=True)
    (tmp_path / "storage" / "u1" / ".tmp-00ff-model.pt").write_bytes(b"half")
    os.utime(tmp_path / "storage" / "u1" / ".tmp-00ff-model.pt", (1000, 1000))

    [upload] = shared_fs.open_uploads()
    assert (upload.key, upload.upload_id, upload.started_at) == (
        "u1/model.pt", "u1/.tmp-00ff-model.pt", 1000)
    shared_fs.abort_upload(upload)
    assert not (tmp_path / "storage" / "u1").exists()  # emptied directories go too
    with pytest.raises(StorageError, match=r"not a temporary file"):
        shared_fs.abort_upload(upload.__class__("u1/a", "u1/a", 0))


def test_shared_fs_writes_leave_no_temporary_files(shared_fs: SharedFs,
                                                   tmp_path: Path) -> None:
    write_random(tmp_path / "src", 1000)
    shared_fs.put_file("u1/a", tmp_path / "src")
    shared_fs.put_bytes("u1/b", b"x", create_once=True)
    shared_fs.put_bytes("u1/b", b"y", create_once=True)

    assert sorted(p.name for p in (tmp_path / "storage" / "u1").iterdir()) == ["a", "b"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused(backend: Backend, tmp_path: Path, key: str) -> None:
    (tmp_path / "src").write_bytes(b"x")

    calls: list[Callable[[], object]] = [
        lambda: backend.put_bytes(key, b"x"),
        lambda: backend.put_file(key, tmp_path / "src"),
        lambda: backend.get_bytes(key, 10),
        lambda: backend.get_file(key, tmp_path / "copy"),
        lambda: backend.exists(key),
        lambda: backend.delete([key]),
    ]
    for call in calls:
        with pytest.raises(StorageError, match=r"invalid storage key"):
            call()
    assert keys(backend) == []


def test_url_names_the_storage_and_key(shared_fs: SharedFs, s3: S3, tmp_path: Path,
                                       s3_bucket: str) -> None:
    assert shared_fs.url("u1/a") == f"{(tmp_path / 'storage').as_uri()}/u1/a"
    assert shared_fs.url() == (tmp_path / "storage").as_uri()
    assert s3.url("u1/a") == f"s3://{s3_bucket}/ckpt/u1/a"
    assert s3.url() == f"s3://{s3_bucket}/ckpt"
    assert S3("b", access_key="k", secret_key="s").url("x") == "s3://b/x"


def test_a_symlink_or_fifo_source_is_refused(backend: Backend, tmp_path: Path) -> None:
    write_random(tmp_path / "real", 100)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")  # opening it blocking would wait forever for a writer

    with pytest.raises(StorageError, match=r"symbolic link"):
        backend.put_file("u1/a", tmp_path / "link")
    with pytest.raises(StorageError, match=r"not a regular file"):
        backend.put_file("u1/a", tmp_path / "fifo")
    with pytest.raises(StorageError, match=r"not a regular file"):
        backend.put_file("u1/a", tmp_path)
    with pytest.raises(StorageError, match=r"No such file"):
        backend.put_file("u1/a", tmp_path / "nope")
    assert keys(backend) == []
    assert backend.open_uploads() == []


def test_a_source_that_changes_while_copied_stores_nothing(backend: Backend) -> None:
    source = Path("/proc/self/status")  # stat says 0 bytes; reading gives more
    if not source.is_file():
        pytest.skip("needs Linux's /proc")

    with pytest.raises(StorageError, match=r"changed while it was copied"):
        backend.put_file("u1/a", source)
    assert not backend.exists("u1/a")
    assert backend.open_uploads() == []


class FailingFile(io.RawIOBase):
    """A file whose disk fails after `good` bytes (EIO)."""

    def __init__(self, good: int) -> None:
        self._left = good

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._left <= 0:
            raise OSError(errno.EIO, "Input/output error")
        n = min(len(buffer), self._left)
        buffer[:n] = b"x" * n
        self._left -= n
        return n


def test_s3_upload_failing_mid_stream_leaves_no_object(s3: S3) -> None:
    reader = HashingReader(io.BufferedReader(FailingFile(PART + PART // 2)), BIG, "model.pt")

    with pytest.raises(StorageError, match=r"cannot upload to s3://.*/u1/a: Input/output"):
        s3._send("u1/a", reader)  # put_file's upload, from a source that fails
    assert not s3.exists("u1/a")
    for upload in s3.open_uploads():  # s3transfer aborts it; a crash would leave it
        s3.abort_upload(upload)
    assert s3.open_uploads() == []
    assert keys(s3) == []


def test_s3_errors_name_the_url_and_never_the_keys(s3_endpoint: str, tmp_path: Path) -> None:
    secret = "SECRET-DO-NOT-LEAK"
    access = "AKIA-TEST-ACCESS"
    backend = S3("muster-no-such-bucket", prefix="p", endpoint_url=s3_endpoint,
                 region="us-east-1", access_key=access, secret_key=secret)
    (tmp_path / "src").write_bytes(b"x")

    calls: list[Callable[[], object]] = [
        lambda: backend.put_bytes("u1/a", b"x"),
        lambda: backend.put_file("u1/a", tmp_path / "src"),
        lambda: backend.get_bytes("u1/a", 10),
        lambda: list(backend.list("")),
        lambda: backend.open_uploads(),
    ]
    for call in calls:
        with pytest.raises(StorageError) as caught:
            call()
        message = str(caught.value)
        assert "s3://muster-no-such-bucket/p" in message
        assert "HTTP 4xx (NoSuchBucket)" in message and "check the bucket name" in message
        assert "does not exist" not in message  # moto's own words go to the log only
        assert "NoSuchBucket" in caught.value.detail
        assert secret not in message and access not in message
        assert secret not in caught.value.detail and access not in caught.value.detail
        assert not isinstance(caught.value, ObjectMissing)
    assert secret not in repr(backend) and access not in repr(backend)


def test_s3_unreachable_endpoint_is_a_storage_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = S3("muster-b", endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1",
                 access_key="AKIA-TEST-ACCESS", secret_key="SECRET-DO-NOT-LEAK")

    with pytest.raises(StorageError, match=r"cannot write s3://muster-b/u1/a: the S3 "
                                           r"endpoint could not be reached.*check "
                                           r"endpoint_url") as caught:
        backend.put_bytes("u1/a", b"x")
    assert "Could not connect" in caught.value.detail  # for the server's log
    assert "SECRET-DO-NOT-LEAK" not in caught.value.for_log()
    assert "AKIA-TEST-ACCESS" not in caught.value.for_log()


class _Banner(http.server.BaseHTTPRequestHandler):
    """Not S3: a service that answers every request with a status and words of its own."""

    def _answer(self) -> None:
        self.send_response(418)
        self.send_header("Content-Type", "application/xml")
        self.end_headers()
        self.wfile.write(b"<Error><Code>Teapot</Code><Message>INTERNAL-BANNER admin panel v2"
                         b"</Message></Error>")

    do_GET = do_PUT = do_POST = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:
        del format, args


def test_a_service_that_is_not_s3_is_no_oracle(tmp_path: Path) -> None:
    """What another service at a storage address says (its words, its exact status) never
    reaches the message a user sees (issue 29, F2); the log keeps it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Banner)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = S3("muster-b", endpoint_url=f"http://127.0.0.1:{server.server_port}",
                     region="us-east-1", access_key="AKIA-TEST", secret_key="SECRET-TEST")
        (tmp_path / "f").write_bytes(b"x")
        for call in (lambda: backend.put_bytes("u1/a", b"x"),
                     lambda: backend.put_file("u1/a", tmp_path / "f"),
                     lambda: backend.get_bytes("u1/a", 10)):
            with pytest.raises(StorageError) as caught:
                call()
            message = str(caught.value)
            assert "HTTP 4xx" in message
            assert "BANNER" not in message and "418" not in message
            assert "Teapot" not in message
            assert "BANNER" in caught.value.detail or "418" in caught.value.detail
    finally:
        server.shutdown()
        server.server_close()


def test_s3_refuses_bad_settings() -> None:
    with pytest.raises(StorageError, match=r"part_size must be at least"):
        S3("b", part_size=1 << 20)
    with pytest.raises(StorageError, match=r"together"):
        S3("b", access_key="k")
    with pytest.raises(StorageError, match=r"prefix"):
        S3("b", prefix="a/../b")
    with pytest.raises(StorageError, match=r"bucket"):
        S3("")
