"""Checkpoint storage in an S3 bucket (AWS, or any S3 API: MinIO, Ceph, moto), via boto3.

Objects live under `<prefix>/`. A large file goes up as a multipart upload read once and in
order through a non-seekable `HashingReader` (s3transfer then reads part after part from
one thread), so the digest returned is that of the bytes sent. s3transfer aborts a multipart
upload that fails; one a crash left behind shows in `open_uploads`.

boto3 is imported when a backend is made, so importing this module is cheap. The access and
secret keys go to boto3 only: no message, `repr()` or attribute shows them.
"""

from __future__ import annotations

import builtins  # inside the class, `list` names the Backend method
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

from muster.checkpoint_storage.base import Backend, ObjectMissing, OpenUpload, StoredObject
from muster.checkpoint_storage.shared_fs import (
    HashingReader,
    check_key,
    check_prefix,
    copy_into,
    open_source,
    os_reason,
    too_large,
)
from muster.errors import StorageError

__all__ = ["S3"]

MIN_PART = 5 << 20  # S3's smallest part (all but the last)
MAX_PARTS = 10_000  # S3's most parts in one upload
_MISSING = frozenset({"NoSuchKey", "NoSuchUpload", "404"})
_TAKEN = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
_HINTS = {
    "NoSuchBucket": "check the bucket name, endpoint_url and region",
    "AccessDenied": "check the credentials and the bucket's policy",
    "InvalidAccessKeyId": "check the credentials",
    "SignatureDoesNotMatch": "check the credentials",
}


# The parts of S3's answers read here, as boto3 hands them out (dicts; boto3 ships no types).
class _Object(TypedDict):
    Key: str
    Size: int
    LastModified: datetime


class _Prefix(TypedDict):
    Prefix: str


class _Upload(TypedDict):
    Key: str
    UploadId: str
    Initiated: datetime


class _Page(TypedDict, total=False):
    """A page of `list_objects_v2` (Contents, CommonPrefixes) or `list_multipart_uploads`
    (Uploads); a key is absent when it would be empty."""

    Contents: list[_Object]
    CommonPrefixes: list[_Prefix]
    Uploads: list[_Upload]


class _Head(TypedDict):
    """What `head_object` says of an object (the part read here)."""

    ContentLength: int


class _KeyTaken(StorageError):
    """`create_once` found the key taken (412; 409 when a concurrent conditional write won)."""


class S3(Backend):
    """Objects in `bucket` under `prefix`, through one thread-safe boto3 client."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None,
                 region: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, multipart_threshold: int = 64 << 20,
                 part_size: int = 16 << 20, max_concurrency: int = 8) -> None:
        self._prefix = _normal_prefix(prefix)
        _check_settings(bucket, access_key, secret_key, part_size, max_concurrency)
        self._bucket = bucket
        self._endpoint_url = endpoint_url
        self._threshold = multipart_threshold
        self._part_size = part_size
        self._concurrency = max_concurrency
        self._secrets = tuple(s for s in (access_key, secret_key) if s)
        with self._errors("connect to", ""):
            self._client = _make_client(endpoint_url, region, access_key, secret_key,
                                        max_concurrency)

    def __repr__(self) -> str:
        return (f"S3(bucket={self._bucket!r}, prefix={self._prefix!r}, "
                f"endpoint_url={self._endpoint_url!r})")

    def url(self, key: str = "") -> str:
        return "s3://" + "/".join(p for p in (self._bucket, self._prefix, key) if p)

    def put_file(self, key: str, source: Path) -> str:
        check_key(key)
        src, size = open_source(source, self.url(key))
        with src:
            return self._send(key, HashingReader(src, size, str(source)))

    def put_bytes(self, key: str, data: bytes, create_once: bool = False) -> bool:
        condition = {"IfNoneMatch": "*"} if create_once else {}
        try:
            with self._errors("write", key):
                self._client.put_object(Bucket=self._bucket, Key=self._object(key), Body=data,
                                        ChecksumAlgorithm="SHA256", **condition)
        except _KeyTaken:
            return False
        return True

    def get_file(self, key: str, dest: Path) -> str:
        with self._errors("download", key):
            body, size = self._get(key)
            with body, open(dest, "xb") as out:
                try:
                    return copy_into(HashingReader(body, size, self.url(key)), out)
                except BaseException:
                    dest.unlink(missing_ok=True)  # leave no truncated copy behind
                    raise

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        with self._errors("read", key):
            body, size = self._get(key)
            with body:
                if size > max_bytes:  # refused before the body is read
                    raise too_large(self.url(key), size, max_bytes)
                data: bytes = body.read()
                return data

    def exists(self, key: str) -> bool:
        try:
            with self._errors("check", key):
                self._client.head_object(Bucket=self._bucket, Key=self._object(key))
        except ObjectMissing:
            return False
        return True

    def list(self, prefix: str) -> Iterator[StoredObject]:
        check_prefix(prefix)
        with self._errors("list", prefix):
            for page in self._pages("list_objects_v2", Prefix=self._full(prefix)):
                for item in page.get("Contents", []):
                    yield StoredObject(key=self._relative(item["Key"]), size=item["Size"],
                                       modified_at=item["LastModified"].timestamp())

    def children(self) -> Iterator[str]:
        with self._errors("list", ""):
            for page in self._pages("list_objects_v2", Prefix=self._full(""), Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    yield self._relative(common["Prefix"]).rstrip("/")
                for item in page.get("Contents", []):
                    yield self._relative(item["Key"])

    def delete(self, keys: builtins.list[str]) -> None:
        names = [self._object(key) for key in keys]
        for key, name in zip(keys, names, strict=True):
            with suppress(ObjectMissing), self._errors("delete", key):
                self._client.delete_object(Bucket=self._bucket, Key=name)

    def open_uploads(self) -> builtins.list[OpenUpload]:
        with self._errors("list the unfinished uploads in", ""):
            return [
                OpenUpload(key=self._relative(upload["Key"]), upload_id=upload["UploadId"],
                           started_at=upload["Initiated"].timestamp())
                for page in self._pages("list_multipart_uploads", Prefix=self._full(""))
                for upload in page.get("Uploads", [])
            ]

    def abort_upload(self, upload: OpenUpload) -> None:
        with suppress(ObjectMissing), self._errors("abort an upload to", upload.key):
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._full(upload.key),
                                                UploadId=upload.upload_id)

    def close(self) -> None:
        self._client.close()

    # -- helpers ---------------------------------------------------------------------------

    def _full(self, name: str) -> str:
        """The bucket key of `name` (a key, or a prefix of keys)."""
        return f"{self._prefix}/{name}" if self._prefix else name

    def _object(self, key: str) -> str:
        return self._full(check_key(key))

    def _relative(self, name: str) -> str:
        return name.removeprefix(self._full(""))

    def _pages(self, operation: str, **kwargs: str) -> Iterator[_Page]:
        pages: Iterator[_Page] = self._client.get_paginator(operation).paginate(
            Bucket=self._bucket, **kwargs)
        return pages

    def _get(self, key: str) -> tuple[Any, int]:
        """The body of `key`'s object, not read yet, and its length."""
        answer = self._client.get_object(Bucket=self._bucket, Key=self._object(key))
        return answer["Body"], int(answer["ContentLength"])

    def _send(self, key: str, reader: HashingReader) -> str:
        """Upload all `reader` holds to `key`; the sha256 hex digest of the bytes sent."""
        from boto3.s3.transfer import TransferConfig

        part_size = max(self._part_size, -(-reader.expected_size // MAX_PARTS))
        config = TransferConfig(multipart_threshold=self._threshold,
                                multipart_chunksize=part_size,
                                max_concurrency=self._concurrency,
                                preferred_transfer_client="classic")  # reads in order
        with self._errors("upload to", key):
            # Each request (each part) carries botocore's default checksum (CRC32) of the
            # bytes sent, which S3 checks on arrival; the SHA-256 of the whole stream, which
            # the caller compares with metadata.json, is the reader's. (Asking S3 for SHA-256
            # part checksums as well cost 5% of the throughput for no further guarantee.)
            self._client.upload_fileobj(reader, self._bucket, self._object(key),
                                        Config=config)
            head = self._client.head_object(Bucket=self._bucket, Key=self._object(key))
        self._check_stored(key, head, reader)
        return reader.sha256.hexdigest()

    def _check_stored(self, key: str, head: _Head, reader: HashingReader) -> None:
        """Delete the object and raise unless S3 holds as many bytes as were sent."""
        if head["ContentLength"] == reader.size:
            return
        self.delete([key])
        raise StorageError(f"cannot upload to {self.url(key)}: S3 stored "
                           f"{head['ContentLength']} bytes of the {reader.size} sent; the "
                           "upload was deleted, retry it")

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text

    @contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        """Turn boto's and the OS's failures into StorageErrors naming the URL, never a key:
        `ObjectMissing` for a missing key or upload, `_KeyTaken` for a failed condition."""
        from botocore.exceptions import BotoCoreError, ClientError

        what = f"cannot {action} {self.url(key)}"
        try:
            yield
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            kind = ObjectMissing if code in _MISSING else _KeyTaken if code in _TAKEN else None
            raise (kind or StorageError)(f"{what}: {_in_our_words(exc)}",
                                         detail=self._redact(_remote_words(exc))) from None
        except BotoCoreError as exc:
            raise StorageError(f"{what}: the S3 endpoint could not be reached or did not "
                               "answer as S3; check endpoint_url, the network and the "
                               "credentials", detail=self._redact(str(exc))) from None
        except OSError as exc:
            raise StorageError(f"{what}: {os_reason(exc)}") from exc


def _normal_prefix(prefix: str) -> str:
    normal = prefix.strip("/")
    try:
        return check_prefix(normal)
    except StorageError:
        raise StorageError(f"an S3 prefix is a relative path of names joined by '/' (no empty, "
                         f"'.' or '..' parts, no NUL), got {prefix=}") from None


def _check_settings(bucket: str, access_key: str | None, secret_key: str | None,
                    part_size: int, max_concurrency: int) -> None:
    if not bucket or "/" in bucket:
        raise StorageError(f"an S3 bucket is a name without '/', got {bucket=}")
    if (access_key is None) != (secret_key is None):
        raise StorageError("give access_key and secret_key together, or neither (boto3's "
                         "default credential chain)")
    if part_size < MIN_PART:
        raise StorageError(f"part_size must be at least {MIN_PART} (S3's smallest part), "
                         f"got {part_size=}")
    if max_concurrency < 1:
        raise StorageError(f"max_concurrency must be at least 1, got {max_concurrency=}")


def _in_our_words(exc: Any) -> str:
    """A failed call as users see it: the operation, the class of the HTTP status, and a
    hint for the S3 error codes muster knows; never the remote's own text."""
    code = exc.response.get("Error", {}).get("Code", "")
    status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    shown = f"HTTP {status[0]}xx" if len(status) == 3 and status[0] in "2345" else "an error"
    known = code if code in _HINTS or code in _MISSING or code in _TAKEN else ""
    hint = _HINTS.get(code)
    return (f"S3 {exc.operation_name} answered {shown}" + (f" ({known})" if known else "")
            + (f"; {hint}" if hint else ""))


def _remote_words(exc: Any) -> str:
    """What S3 answered, whole, for the server's log: status, code and message."""
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    return (f"S3 {exc.operation_name} answered {status} {error.get('Code', '')}: "
            f"{error.get('Message', '')}")


def _make_client(endpoint_url: str | None, region: str | None, access_key: str | None,
                 secret_key: str | None, max_concurrency: int) -> Any:
    """One boto3 client (thread-safe) with retries and timeouts; path-style addressing on
    a custom endpoint, which S3-compatible servers expect."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(aws_access_key_id=access_key,
                                    aws_secret_access_key=secret_key, region_name=region)
    config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10,
                    read_timeout=120, tcp_keepalive=True,
                    max_pool_connections=max(10, max_concurrency + 2),
                    s3={"addressing_style": "path"} if endpoint_url else None)
    return session.client("s3", endpoint_url=endpoint_url, config=config)
