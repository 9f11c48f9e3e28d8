"""Where muster keeps its files: `$MUSTER_HOME` (default `~/.muster`) and its layout."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from muster.rundir import RunDir


@dataclass(frozen=True)
class Home:
    """The layout of one muster home directory.

    ```
    $MUSTER_HOME/muster.db                       embedded SQLite store (WAL)
    $MUSTER_HOME/token                           API bearer token (0600)
    $MUSTER_HOME/server.json                     pid, start time and URL of a running server
    $MUSTER_HOME/experiments/<uuid>/context/     snapshot of the submitted context directory
    $MUSTER_HOME/runs/<trial-uuid>/              a trial's run directory (`muster.rundir`)
    ```
    """

    root: Path

    @classmethod
    def resolve(cls, override: str | os.PathLike[str] | None = None) -> Home:
        """The home named by `override`, else `$MUSTER_HOME`, else `~/.muster`."""
        raw = override or os.environ.get("MUSTER_HOME") or "~/.muster"
        return cls(Path(raw).expanduser().resolve())

    def ensure(self) -> Home:
        for path in (self.root, self.runs_dir, self.experiments_dir):
            path.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def default_db_url(self) -> str:
        return f"sqlite:///{self.root / 'muster.db'}"

    @property
    def token_path(self) -> Path:
        return self.root / "token"

    @property
    def server_file(self) -> Path:
        return self.root / "server.json"

    @property
    def cluster_config_path(self) -> Path:
        """The cluster config `muster up` reads when not given `--cluster-config`."""
        return self.root / "cluster.yaml"

    @property
    def fake_gpus_dir(self) -> Path:
        """Where a fake GPU inventory keeps each GPU's used memory (`<index>/used_bytes`)."""
        return self.root / "fake-gpus"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def experiments_dir(self) -> Path:
        return self.root / "experiments"

    def context_dir(self, experiment_uuid: str) -> Path:
        return self.experiments_dir / experiment_uuid / "context"

    def run_dir(self, trial_uuid: str) -> RunDir:
        return RunDir(self.runs_dir / trial_uuid)
