"""Fixtures for the storage tests: a real S3 API (moto's server on a loopback port), a
fresh bucket per test, a shared_fs directory, and `backend`, which is each of them in turn.

moto is a dev dependency (`make install`), so nothing here is skipped.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from muster.checkpoint_storage.base import Backend
from muster.checkpoint_storage.s3 import S3
from muster.checkpoint_storage.shared_fs import TMP_PREFIX, SharedFs
from tests.supervise.conftest import home, rig, sqlite_rig, sqlite_store  # noqa: F401 - rigs

PART = 5 << 20  # S3's smallest part: files of more than this go up in parts
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
               "region_name": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server, started for the session."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Any:
    """A plain boto3 client on the moto server, to arrange what a backend must find."""
    return boto3.session.Session(**CREDENTIALS).client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def s3_bucket(s3_client: Any) -> str:
    """A new, empty bucket."""
    name = f"muster-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3(s3_endpoint: str, s3_bucket: str) -> Iterator[S3]:
    """An S3 backend on a fresh bucket, under a prefix, with 5 MiB parts."""
    backend = S3(s3_bucket, prefix="/ckpt/", endpoint_url=s3_endpoint, region="us-east-1",
                 access_key="testing", secret_key="testing", multipart_threshold=PART,
                 part_size=PART, max_concurrency=4)
    yield backend
    backend.close()


@pytest.fixture
def shared_fs(tmp_path: Path) -> SharedFs:
    """A shared_fs backend whose root does not exist yet (the first write makes it)."""
    return SharedFs(tmp_path / "storage")


@pytest.fixture(params=["shared_fs", "s3"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each backend in turn: the contract tests run against both."""
    chosen: Backend = request.getfixturevalue(request.param)
    return chosen


@pytest.fixture
def abandon_upload(backend: Backend, request: pytest.FixtureRequest
                   ) -> Callable[[str], None]:
    """Begin a write of a key and never finish it, as a crash would."""
    if isinstance(backend, S3):
        client, bucket = request.getfixturevalue("s3_client"), request.getfixturevalue("s3_bucket")

        def abandon_s3(key: str) -> None:
            started = client.create_multipart_upload(Bucket=bucket, Key=f"ckpt/{key}")
            client.upload_part(Bucket=bucket, Key=f"ckpt/{key}", PartNumber=1,
                               UploadId=started["UploadId"], Body=b"x" * 1000)
        return abandon_s3
    assert isinstance(backend, SharedFs)
    root = request.getfixturevalue("tmp_path") / "storage"

    def abandon_file(key: str) -> None:
        final = root / key
        final.parent.mkdir(parents=True, exist_ok=True)
        final.with_name(f"{TMP_PREFIX}{secrets.token_hex(8)}-{final.name}").write_bytes(b"x")
    return abandon_file
