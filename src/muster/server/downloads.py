"""A file sent for a browser (or `curl -OJ`) to save: a stream, an attachment.

The bytes come from a blocking iterator, run on a worker thread a chunk at a time, so a
file of any size passes through without being held. Its length is announced up front
(Content-Length), so a download that stops early is a broken one to every client, never a
shorter file that looks whole: when the iterator raises a `MusterError` after the 200 has
gone out (a checkpoint file no longer matches its sha256), the error is logged and the
connection closed. A stream whose length cannot be known up front (a tar.gz made as it is
sent) goes without Content-Length, in chunks: its own format must show a cut (gzip's trailer
does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from muster.errors import MusterError

__all__ = ["Download", "attachment"]

log = logging.getLogger(__name__)


def attachment(filename: str) -> str:
    """The Content-Disposition of a file to save as `filename` (quotes and backslashes and
    anything outside printable ASCII become `_`; muster's names have none of them)."""
    safe = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename)
    return f'attachment; filename="{safe}"'


class Download(StreamingResponse):
    """`chunks`, `size` bytes in all (None: not known before the end), as the attachment
    `filename`; `close` is called however the response ends (sent, its client gone, or
    broken off)."""

    def __init__(
        self, chunks: Iterator[bytes], *, size: int | None, filename: str, media_type: str,
        close: Callable[[], None], headers: Mapping[str, str] | None = None,
    ) -> None:
        length = {} if size is None else {"Content-Length": str(size)}
        super().__init__(chunks, media_type=media_type, headers={
            **(headers or {}), **length, "Content-Disposition": attachment(filename)})
        self._filename, self._close = filename, close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except MusterError as exc:
            # Too late for an error status: the server closes the connection short of the
            # announced length, which every client reports as a failed download.
            log.warning("download of %s broken off: %s", self._filename, exc)
        finally:
            self._close()
