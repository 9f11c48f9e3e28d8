"""The web UI's static files, kept by browsers for as long as they stay the same.

A page names each of its scripts and styles as `/static/NAME?v=DIGEST` (the templates'
`asset` function), DIGEST the start of the SHA-256 of the file's bytes. Such an address is
answered `Cache-Control: public, max-age=31536000, immutable`: a browser that has it asks no
more, so a page visited again, or one whose scripts another page loaded, fetches none of them
(each was a request to the server on every visit, and on a busy server tens of milliseconds
before the page could run). A new version of a file has a new digest, hence a new address.
An address without `v`, or with a digest the file no longer has (a page from before an
upgrade), is answered `no-cache`: the browser asks again each time, with the ETag (304).
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from urllib.parse import parse_qs

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from muster import ui

__all__ = ["IMMUTABLE", "Assets", "asset"]

IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
DIGEST_CHARS = 12  # hex digits of SHA-256 in an address: 48 bits, against a stale hit

_digests: dict[Path, tuple[int, int, str]] = {}  # file → (mtime_ns, size, digest)
_lock = threading.Lock()


def _digest(path: Path) -> str | None:
    """The file's digest (cached while its mtime and size hold); None if there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    with _lock:
        known = _digests.get(path)
    if known is not None and known[:2] == (stat.st_mtime_ns, stat.st_size):
        return known[2]
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:DIGEST_CHARS]
    except OSError:
        return None
    with _lock:
        _digests[path] = (stat.st_mtime_ns, stat.st_size, digest)
    return digest


def asset(name: str) -> str:
    """The address of static file `name` (relative to the UI's static folder) with its
    digest; without one if the file is not there (the page says which are missing)."""
    digest = _digest(ui.STATIC / name)
    return f"/static/{name}" if digest is None else f"/static/{name}?v={digest}"


class Assets(StaticFiles):
    """StaticFiles whose answers say how long a browser may keep them (see the module)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code not in (200, 304):
            return response
        wanted = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("v", [""])[0]
        current = _digest(ui.STATIC / path) if wanted else None
        response.headers["Cache-Control"] = IMMUTABLE if wanted and wanted == current \
            else REVALIDATE
        return response
