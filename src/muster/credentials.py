"""The API tokens `muster login` keeps for remote servers: `~/.config/muster/credentials`.

```json
{"servers": {"https://muster.example.com": {"token": "mst_...", "user": "alice"}}}
```

The file is 0600 in a 0700 directory (`$XDG_CONFIG_HOME/muster`, default `~/.config/muster`),
written atomically. Which token the CLI sends: `$MUSTER_TOKEN`, else the one kept here for
the server's URL, else the server's own admin token in `$MUSTER_HOME/secrets/token` (the
single-user laptop, where the CLI runs as the server's user).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypedDict

from muster.atomic import atomic_write_json

__all__ = ["Credentials", "KeptToken", "credentials_path"]


class KeptToken(TypedDict):
    """One server's entry in the file."""

    token: str
    user: str


def credentials_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "muster" / "credentials"


class Credentials:
    """The kept tokens, by server URL (without a trailing slash)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or credentials_path()

    def _servers(self) -> dict[str, object]:
        """The entries by URL, as read: each is checked where it is used, and one that is
        not a `KeptToken` is kept as it is when the file is written again."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path} is not readable JSON ({exc}); delete it and "
                             "`muster login` again") from exc
        servers = data.get("servers") if isinstance(data, dict) else None
        return servers if isinstance(servers, dict) else {}

    def token_for(self, url: str) -> str | None:
        entry = self._servers().get(url.rstrip("/"))
        token = entry.get("token") if isinstance(entry, dict) else None
        return token if isinstance(token, str) and token else None

    def user_for(self, url: str) -> str | None:
        entry = self._servers().get(url.rstrip("/"))
        user = entry.get("user") if isinstance(entry, dict) else None
        return user if isinstance(user, str) else None

    def keep(self, url: str, token: str, user: str) -> None:
        servers = self._servers()
        servers[url.rstrip("/")] = KeptToken(token=token, user=user)
        self._write(servers)

    def forget(self, url: str) -> bool:
        """Drop the token kept for `url`; False when there was none."""
        servers = self._servers()
        if servers.pop(url.rstrip("/"), None) is None:
            return False
        self._write(servers)
        return True

    def _write(self, servers: dict[str, object]) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_json(self.path, {"servers": servers}, mode=0o600)
