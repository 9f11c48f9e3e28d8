"""Where a checkpoint storage is, without its secrets, and the GC policy in force.

A `Location` is what the store keeps with each checkpoint (`Checkpoint.storage`): its
type and place, and *where* its keys are read (`env:NAME`, `file:/path`), never the keys.
`open_backend` reads them on the server when it needs a connection.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from muster.checkpoint_storage.base import Backend
from muster.checkpoint_storage.planner import Policy
from muster.config.schema import CheckpointStorageConfig
from muster.config.secrets import source_of
from muster.errors import ConfigError, StorageError
from muster.home import Home

__all__ = ["Location", "effective_location", "effective_policy", "open_backend"]


@dataclass(frozen=True)
class Location:
    type: str  # "shared_fs" | "s3"
    path: str | None = None  # shared_fs
    bucket: str | None = None  # s3, and the rest
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None  # a secret source (`env:NAME`, `file:/path`), never a key
    secret_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Location:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def url(self, key: str = "") -> str:
        """Where `key` is, for people (the same text the backend gives)."""
        if self.type == "shared_fs":
            base = Path(self.path or "/").as_uri()
        else:
            base = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        return f"{base}/{key}" if key else base


def effective_location(config: CheckpointStorageConfig, default: CheckpointStorageConfig | None,
                       home: Home) -> Location:
    """The experiment's storage: its own when its config names a type, else the cluster's
    default, else shared_fs in `$MUSTER_HOME/checkpoints`."""
    for chosen in (config, default):
        if chosen is not None and chosen.type is not None:
            return Location(type=chosen.type, path=chosen.path, bucket=chosen.bucket,
                            prefix=chosen.prefix, endpoint_url=chosen.endpoint_url,
                            region=chosen.region, access_key=chosen.access_key,
                            secret_key=chosen.secret_key)
    return Location(type="shared_fs", path=str(home.checkpoints_dir))


def effective_policy(config: CheckpointStorageConfig, default: CheckpointStorageConfig | None,
                     override: dict[str, int] | None = None) -> Policy:
    """The GC counts in force: set after submission (`override`), else the experiment's,
    else the cluster's default, else Determined's (latest 1, best 1, experiment best 0)."""
    counts: dict[str, int] = {}
    for name, fallback in (("save_trial_latest", 1), ("save_trial_best", 1),
                           ("save_experiment_best", 0)):
        chosen = [(override or {}).get(name), getattr(config, name),
                  getattr(default, name) if default is not None else None, fallback]
        counts[name] = next(v for v in chosen if v is not None)
    return Policy(**counts)


def open_backend(location: Location, home: Path, environ: dict[str, str] | None = None
                 ) -> Backend:
    """A backend for `location`, its keys read now (never from a file in `home`, the
    server's `$MUSTER_HOME`).

    Raises:
        StorageError: a key cannot be read on the server, or the type is unknown.
    """
    if location.type == "shared_fs":
        from muster.checkpoint_storage.shared_fs import SharedFs

        return SharedFs(Path(location.path or "/"))
    if location.type == "s3":
        from muster.checkpoint_storage.s3 import S3

        access, secret = (_secret(location, "access_key", home, environ),
                          _secret(location, "secret_key", home, environ))
        return S3(location.bucket or "", location.prefix, location.endpoint_url,
                  location.region, access, secret)
    raise StorageError(f"unknown checkpoint storage type {location.type!r}")


def _secret(location: Location, name: str, home: Path, environ: dict[str, str] | None
            ) -> str | None:
    from muster.job_secrets import read_on_server

    reference = getattr(location, name)
    if reference is None:
        return None
    try:
        return read_on_server(name, source_of(reference), os.environ if environ is None
                              else environ, home)
    except (ConfigError, ValueError) as exc:
        raise StorageError(f"the {name} of {location.url()} cannot be read: {exc}") from None
