"""The upload form of `POST /experiments` (config and context), read from the request stream.

The route reads its body here, after the bearer token has been checked, instead of
declaring `Form`/`File` parameters: FastAPI parses those before any dependency runs, so an
anonymous client could make the server spool a body of any size to /tmp. Here a body
announced too large is refused unread, and every body is counted as it arrives and refused
past its limit whatever Content-Length says. A multipart form (at most MAX_REQUEST_BYTES)
streams its `context` part to a file (at most MAX_UPLOAD_BYTES), keeps its `config` part in
memory (at most MAX_CONFIG_BYTES; a batch repeats it, at most MAX_BATCH times and
MAX_BATCH_CONFIG_BYTES in all, every config sharing the one context), its `git` part too
(the context's git state, `muster.git_state`, at most MAX_GIT_BYTES), and reads past any
other part; a urlencoded form
(what clients send without a context) holds the config and the small fields (at most
MAX_URLENCODED_BYTES in all).
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from fastapi.exceptions import RequestValidationError
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from muster import git_state
from muster.errors import InvalidRequest, PayloadTooLarge
from muster.git_state import GitState
from muster.services import idempotency
from muster.services.uploads import MAX_UPLOAD_BYTES

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

MAX_CONFIG_BYTES = 1024**2
MAX_BATCH = 1000  # configs in one request: a batch create (`Client.create_experiments`)
MAX_BATCH_CONFIG_BYTES = 16 * 1024**2  # every config of a batch together
MAX_SECRETS_BYTES = 1024**2  # the `secrets` field: a JSON object of NAME: value
MAX_GIT_BYTES = git_state.MAX_FIELD_BYTES  # the `git` field: a JSON object, the diff in it
MAX_REQUEST_BYTES = (MAX_UPLOAD_BYTES + MAX_BATCH_CONFIG_BYTES + MAX_SECRETS_BYTES
                     + MAX_GIT_BYTES + 64 * 1024 + MAX_BATCH * 256)  # + part headers
# Percent-encoding triples a byte at most.
MAX_URLENCODED_BYTES = 3 * (MAX_BATCH_CONFIG_BYTES + MAX_SECRETS_BYTES + MAX_GIT_BYTES) + 1024
CONFIG, CONTEXT, SECRETS, CONTEXT_FROM, GIT = (
    "config", "context", "secrets", "context_from", "git")
MAX_CONTEXT_FROM_BYTES = 16
_MiB = 1024**2
_HOW = ("send multipart/form-data with the fields `config` and `context` (and `git`, the "
        "context's git state as JSON, when it has one), or a urlencoded form with `config` "
        "alone, as `muster experiment create CONFIG DIR` does")
_KEEP_OUT = "keep data sets and environments out of the context directory"
_CONFIG_SCHEMA = {"type": "string",
                  "description": f"the experiment config, YAML (at most {MAX_CONFIG_BYTES} "
                                 f"bytes). Repeat the field to create up to {MAX_BATCH} "
                                 "experiments from one context (at most "
                                 f"{MAX_BATCH_CONFIG_BYTES} bytes of configs in all): the "
                                 "answer is then a list, in the order of the configs"}
_CONTEXT_FROM_SCHEMA = {"type": "string", "pattern": "^[0-9]{1,10}$",
                        "description": "run again: the id of an experiment whose context "
                                       "snapshot this one reuses (instead of `context`)"}
_GIT_SCHEMA = {"type": "string",
               "description": "the context's git state, a JSON object: {\"commit\": 40 or 64 "
                              "lowercase hex digits, \"branch\": text or null, \"dirty\": "
                              "bool, \"diff\": `git diff HEAD --binary` of the context, text "
                              f"of at most {git_state.MAX_DIFF_BYTES // _MiB} MiB, or null, "
                              "\"diff_sha256\": its sha256 or null, \"diff_truncated\": "
                              "bool (true: the diff was too large, or not UTF-8, and only "
                              f"its sha256 is sent)}}, at most {MAX_GIT_BYTES:,} bytes; "
                              "a run again (`context_from`) keeps its snapshot's own"}
_SECRETS_SCHEMA = {"type": "string",
                   "description": "the values of the config's `submit` secrets "
                                  "(environment.secrets), a JSON object of NAME: value; never "
                                  "returned by the API"}

# For /openapi.json: the route declares no Form parameters, so it states its body itself.
REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {"schema": {
            "type": "object",
            "required": [CONFIG],
            "properties": {
                CONFIG: _CONFIG_SCHEMA,
                CONTEXT: {"type": "string", "format": "binary",
                          "description": "the context directory, a tar.gz (gzip) or zip "
                                         f"archive of at most {MAX_UPLOAD_BYTES // _MiB} MiB"},
                GIT: _GIT_SCHEMA,
                SECRETS: _SECRETS_SCHEMA,
                CONTEXT_FROM: _CONTEXT_FROM_SCHEMA,
            },
        }},
        "application/x-www-form-urlencoded": {"schema": {
            "type": "object", "required": [CONFIG],
            "properties": {CONFIG: _CONFIG_SCHEMA, GIT: _GIT_SCHEMA, SECRETS: _SECRETS_SCHEMA,
                           CONTEXT_FROM: _CONTEXT_FROM_SCHEMA},
        }},
    },
}


@dataclass(frozen=True)
class UploadForm:
    configs: tuple[str, ...]  # one per experiment to create (a batch: several), in order
    archive: Path | None  # the uploaded context, if the form has one
    secrets: dict[str, str] | None = None  # the `submit` secrets' values, if sent
    context_from: int | None = None  # run again: that experiment's context snapshot
    git: GitState | None = None  # the context's git state, if sent
    context_sha256: str | None = None  # the uploaded context's, hex (the request's digest)

    def digest(self) -> str:
        """The sha256 of what the form asks (`idempotency.request_digest`)."""
        return idempotency.request_digest(self.configs, self.context_sha256,
                                          self.context_from, self.git, list(self.secrets or {}))


async def read_upload_form(request: Request, folder: Path) -> UploadForm:
    """The form of `request`; its context, if any, is written to `folder/context.tar.gz`.

    Raises:
        InvalidRequest: not a form, malformed, cut off, or with a field twice.
        PayloadTooLarge: the body, the context or the config passes its limit.
        RequestValidationError: the form has no `config` (a 422, as for any missing field).
    """
    content_type = request.headers.get("content-type")
    kind, options = parse_options_header(content_type)
    if kind == b"multipart/form-data":
        return await _read_multipart(request, options.get(b"boundary"), folder)
    if kind in (b"", b"application/x-www-form-urlencoded"):
        return await _read_urlencoded(request)
    raise InvalidRequest(f"the request's Content-Type is {content_type!r}, not a form; {_HOW}")


async def _read_multipart(request: Request, boundary: bytes | None, folder: Path
                          ) -> UploadForm:
    if not boundary:
        raise InvalidRequest(f"the request's multipart/form-data Content-Type has no "
                             f"boundary; {_HOW}")
    form = _Form(folder / "context.tar.gz")
    try:
        parser = MultipartParser(boundary, form.callbacks())
        async for chunk in _body(request, MAX_REQUEST_BYTES, holds=(
                f"a context of at most {MAX_UPLOAD_BYTES // _MiB} MiB and a config of at most "
                f"{MAX_CONFIG_BYTES // _MiB} MiB")):
            parser.write(chunk)
    except FormParserError as exc:
        raise InvalidRequest(f"the request is not a readable multipart form ({exc}); {_HOW}"
                             ) from exc
    finally:
        form.close()
    return form.result()


async def _read_urlencoded(request: Request) -> UploadForm:
    chunks = [chunk async for chunk in _body(request, MAX_URLENCODED_BYTES, holds=(
        f"a urlencoded form holds a config of at most {MAX_CONFIG_BYTES // _MiB} MiB and "
        "small fields"))]
    try:
        fields = urllib.parse.parse_qs(b"".join(chunks).decode("ascii"), keep_blank_values=True,
                                       errors="strict", max_num_fields=MAX_BATCH + 16)
    except ValueError as exc:  # (UnicodeDecodeError too)
        raise InvalidRequest(f"the request is not a readable urlencoded form ({exc}); {_HOW}"
                             ) from exc
    kept: dict[str, bytes] = {}
    for name in _KEPT:
        values = fields.get(name, [])
        if len(values) > 1:
            raise _twice(name)
        if values:
            kept[name] = values[0].encode()
    configs = [value.encode() for value in fields.get(CONFIG, [])]
    if len(configs) > MAX_BATCH:
        raise _too_many_configs()
    for config in configs:
        if len(config) > MAX_CONFIG_BYTES:
            raise _config_too_large()
    if sum(map(len, configs)) > MAX_BATCH_CONFIG_BYTES:
        raise _batch_too_large()
    return _assemble(configs, kept, None)


def _assemble(configs: list[bytes], fields: Mapping[str, bytes], archive: Path | None,
              context_sha256: str | None = None) -> UploadForm:
    """The form from its configs, the other fields kept in memory (by name) and the
    context (and its sha256), if any."""
    for name, value in fields.items():
        limit, too_large = _KEPT[name]
        if len(value) > limit:
            raise too_large()
    if not configs:
        raise _missing_config()
    texts = []
    for number, raw in enumerate(configs, 1):
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            which = f" (config {number} of {len(configs)})" if len(configs) > 1 else ""
            raise InvalidRequest(f"the `config` field{which} is not UTF-8 text ({exc})"
                                 ) from exc
    if CONTEXT_FROM in fields and archive is not None:
        raise InvalidRequest("the form has both `context` and `context_from`; send one")
    if CONTEXT_FROM in fields and GIT in fields:
        raise InvalidRequest("the form has both `git` and `context_from`; a reused context "
                             "snapshot keeps its own git state: send one")
    secrets, source, git = fields.get(SECRETS), fields.get(CONTEXT_FROM), fields.get(GIT)
    return UploadForm(tuple(texts), archive, None if secrets is None else _secrets(secrets),
                      None if source is None else _context_from(source),
                      None if git is None else git_state.parse_field(git),
                      None if archive is None else context_sha256)


def _twice(name: str) -> InvalidRequest:
    return InvalidRequest(f"the form has the field `{name}` twice; {_HOW}")


def _context_from(raw: bytes) -> int:
    """The `context_from` field: an experiment's id."""
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit() or not 1 <= int(text) <= 2**31 - 1:
        raise InvalidRequest(f"`context_from` must be an experiment's id, got {text[:20]!r}")
    return int(text)


def _secrets(raw: bytes) -> dict[str, str]:
    """The `secrets` field: a JSON object of names and text values."""
    if len(raw) > MAX_SECRETS_BYTES:
        raise _secrets_too_large()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError too; nested past
        # the parser's depth)
        raise InvalidRequest(f"the `secrets` field is not JSON text ({exc}); send an object "
                             'of NAME: value, e.g. {"WANDB_API_KEY": "..."}') from exc
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise InvalidRequest('the `secrets` field must be a JSON object of NAME: text value, '
                             'e.g. {"WANDB_API_KEY": "..."}')
    return data


async def _body(request: Request, limit: int, holds: str) -> AsyncIterator[bytes]:
    """The body as it arrives. One announced larger than `limit` is refused unread; one
    without a Content-Length, or with a wrong one, when it passes `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise InvalidRequest(f"the request's Content-Length {declared!r} is not a number")
    if declared is not None and int(declared) > limit:
        raise _too_large(limit, holds)
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise _too_large(limit, holds)
            yield chunk
    except ClientDisconnect as exc:
        raise InvalidRequest("the client went away before the form was sent whole") from exc


def _too_large(limit: int, holds: str) -> PayloadTooLarge:
    size = f"{limit // _MiB} MiB" if limit >= _MiB else f"{limit} bytes"
    return PayloadTooLarge(f"the request is larger than {size} ({holds}); {_KEEP_OUT}")


def _config_too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"the `config` field is larger than {MAX_CONFIG_BYTES // _MiB} MiB; "
                           "a config is YAML text: keep data out of it")


def _too_many_configs() -> PayloadTooLarge:
    return PayloadTooLarge(f"the form has more than {MAX_BATCH} `config` fields; create at "
                           f"most {MAX_BATCH} experiments in one request")


def _batch_too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"the form's configs are larger than "
                           f"{MAX_BATCH_CONFIG_BYTES // _MiB} MiB together; send them in "
                           "several requests")


def _secrets_too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"the `secrets` field is larger than {MAX_SECRETS_BYTES // _MiB} MiB")


def _not_an_id() -> InvalidRequest:
    return InvalidRequest("`context_from` must be an experiment's id")


# The fields kept in memory once each (`config`, which a batch repeats, is kept apart):
# each one's limit, and the answer past it.
_KEPT: dict[str, tuple[int, Callable[[], InvalidRequest]]] = {
    SECRETS: (MAX_SECRETS_BYTES, _secrets_too_large),
    CONTEXT_FROM: (MAX_CONTEXT_FROM_BYTES, _not_an_id),
    GIT: (MAX_GIT_BYTES, git_state.field_too_large),
}


def _missing_config() -> RequestValidationError:
    return RequestValidationError([{"type": "missing", "loc": ("body", CONFIG),
                                    "msg": f"Field required: {_HOW}", "input": None}])


class _Form:
    """The parser's callbacks: where each part's bytes go, within each part's limit."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive
        self.fields: dict[str, bytearray] = {}  # the parts kept in memory (_KEPT), by name
        self.configs: list[bytearray] = []  # the `config` parts, in order
        self.config_bytes = 0
        self.context: BinaryIO | None = None
        self.context_bytes = 0
        self.context_hash = hashlib.sha256()
        self.part: str | None = None  # the field being read, if it is one we keep
        self.header_name, self.header_value = bytearray(), bytearray()
        self.disposition = b""
        self.complete = False  # the closing boundary has been read

    def callbacks(self) -> MultipartCallbacks:
        return {"on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._data,
                "on_end": self._end}

    def result(self) -> UploadForm:
        if not self.complete:
            raise InvalidRequest(f"the form ends before its closing boundary; {_HOW}")
        return _assemble([bytes(config) for config in self.configs],
                         {name: bytes(value) for name, value in self.fields.items()},
                         self.archive if self.context is not None else None,
                         self.context_hash.hexdigest())

    def close(self) -> None:
        if self.context is not None:
            self.context.close()

    def _part_begin(self) -> None:
        self.part, self.disposition = None, b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def _header_end(self) -> None:
        if self.header_name.lower() == b"content-disposition":
            self.disposition = bytes(self.header_value)
        self.header_name, self.header_value = bytearray(), bytearray()

    def _headers_finished(self) -> None:
        name = parse_options_header(self.disposition)[1].get(b"name", b"").decode("latin-1")
        self.part = name if name in _KEPT or name in (CONTEXT, CONFIG) else None
        if self.part is None:
            return
        if self.part in self.fields or (self.part == CONTEXT and self.context is not None):
            raise _twice(self.part)
        if self.part == CONFIG:
            if len(self.configs) == MAX_BATCH:
                raise _too_many_configs()
            self.configs.append(bytearray())
        elif self.part == CONTEXT:
            self.context = self.archive.open("xb")
        else:
            self.fields[self.part] = bytearray()

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self.part == CONTEXT and self.context is not None:
            self.context_bytes += end - start
            if self.context_bytes > MAX_UPLOAD_BYTES:
                raise PayloadTooLarge(f"the context upload is larger than "
                                      f"{MAX_UPLOAD_BYTES // _MiB} MiB; {_KEEP_OUT}")
            self.context.write(data[start:end])
            self.context_hash.update(data[start:end])
        elif self.part == CONFIG:
            config = self.configs[-1]
            config += data[start:end]
            self.config_bytes += end - start
            if len(config) > MAX_CONFIG_BYTES:
                raise _config_too_large()
            if self.config_bytes > MAX_BATCH_CONFIG_BYTES:
                raise _batch_too_large()
        elif self.part is not None:
            kept = self.fields[self.part]
            kept += data[start:end]
            limit, too_large = _KEPT[self.part]
            if len(kept) > limit:
                raise too_large()

    def _end(self) -> None:
        self.complete = True
