"""Bearer-token auth: one token per muster home, created on the server's first start."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from muster.errors import Unauthorized


def ensure_token(path: Path) -> str:
    """Read the token at `path`, creating it (mode 0600) if there is none yet."""
    try:
        return read_token(path)
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another server process created it first: use that one
        return read_token(path)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
        out.flush()
        os.fsync(out.fileno())
    return token


def read_token(path: Path) -> str:
    token = path.read_text().strip()
    if not token:
        raise Unauthorized(f"the token file {path} is empty; delete it and restart the server")
    return token


def presented_token(header: str | None) -> str:
    """The token an `Authorization: Bearer <token>` header presents ("" for another scheme)."""
    scheme, _, given = (header or "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def check_bearer(header: str | None, token: str) -> None:
    """Raise Unauthorized unless `header` is `Bearer <token>`."""
    given = presented_token(header)
    # Bytes, because compare_digest refuses non-ASCII str (a header may carry any byte).
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized(
            "missing or wrong bearer token; the CLI reads it from $MUSTER_HOME/secrets/token"
        )
