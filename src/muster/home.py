"""Where muster keeps its files: `$MUSTER_HOME` (default `~/.muster`) and its layout.

The home is private to the user the server runs as: the directory is 0700, and the server
creates its files 0600 and directories 0700 (`muster up` sets umask 077). Credentials sit in
`secrets/`, which no run directory lies under: a job's working directory is under `runs/`,
so walking up from it never passes the token. (A job runs as the server's user and can
still read, by its full path, whatever that user can; running jobs as users of their own
is the users issue's isolation.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# run_dir() imports RunDir: a CLI command that only calls the server reads the home for its
# URL and token, never a run directory.
if TYPE_CHECKING:
    from muster.rundir import RunDir


@dataclass(frozen=True)
class Home:
    """The layout of one muster home directory.

    ```
    $MUSTER_HOME/muster.db                       embedded SQLite store (WAL)
    $MUSTER_HOME/secrets/token                   API bearer token (0600)
    $MUSTER_HOME/secrets/experiments/<uuid>.json the secrets submitted with an experiment
    $MUSTER_HOME/server.json                     pid, start time and URL of a running server
    $MUSTER_HOME/experiments/<uuid>/context/     snapshot of the submitted context directory
    $MUSTER_HOME/experiments/<uuid>/git.json     its git state, if it had one (`muster.git_state`)
    $MUSTER_HOME/experiments/<uuid>/git.diff     its diff against that commit, if sent
    $MUSTER_HOME/runs/<trial-uuid>/              a trial's run directory (`muster.rundir`)
    $MUSTER_HOME/envs/                           built Python environments (`muster.environments`)
    ```

    With `launcher: ray`, what the replicas on other nodes read and write — `runs/`,
    `checkpoint-cache/` and `envs/` — lives under `shared` instead (the cluster config's
    `ray.storage_path`, mounted at the same path on every node); the rest stays here.
    """

    root: Path
    shared: Path | None = None  # where runs, the checkpoint cache and environments live

    @classmethod
    def resolve(cls, override: str | os.PathLike[str] | None = None) -> Home:
        """The home named by `override`, else `$MUSTER_HOME`, else `~/.muster`."""
        raw = override or os.environ.get("MUSTER_HOME") or "~/.muster"
        return cls(Path(raw).expanduser().resolve())

    def ensure(self, jobs_enter: bool = False) -> Home:
        """Create the layout, private to this user; a token left at the home's top level by
        an earlier version moves into `secrets/` (the same token: clients keep working).

        Args:
            jobs_enter: jobs run as other accounts (`run_as`): they may pass through the
                home and `runs/` to their own run directories (0711: entered, never listed);
                everything else stays 0700/0600.
        """
        for path in (self.root, self.runs_dir, self.experiments_dir, self.secrets_dir):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        passable = 0o711 if jobs_enter else 0o700
        for path, mode in ((self.root, passable), (self.runs_dir, passable),
                           (self.secrets_dir, 0o700), (self.experiments_dir, 0o700)):
            path.chmod(mode)
        if jobs_enter:
            self._close_top_level()
        old = self.root / "token"
        if old.is_file() and not self.token_path.exists():
            old.chmod(0o600)
            os.replace(old, self.token_path)
        return self

    def _close_top_level(self) -> None:
        """Once jobs may pass through the home, nothing at its top level but `runs/` and
        `envs/` may be open to others: not a database, a log redirected by hand, or a file
        an earlier version made 0644."""
        for entry in os.scandir(self.root):
            if entry.name in (self.runs_dir.name, self.envs_dir.name) or entry.is_symlink():
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if mode & 0o077:
                os.chmod(entry.path, mode & 0o700)

    @property
    def default_db_url(self) -> str:
        return f"sqlite:///{self.root / 'muster.db'}"

    @property
    def secrets_dir(self) -> Path:
        return self.root / "secrets"

    @property
    def token_path(self) -> Path:
        return self.secrets_dir / "token"

    def secrets_file(self, experiment_uuid: str) -> Path:
        """The values of the secrets submitted with an experiment (0600)."""
        return self.secrets_dir / "experiments" / f"{experiment_uuid}.json"

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
    def envs_dir(self) -> Path:
        """Built Python environments (`muster.environments`)."""
        return (self.shared or self.root) / "envs"

    @property
    def runs_dir(self) -> Path:
        return (self.shared or self.root) / "runs"

    @property
    def checkpoints_dir(self) -> Path:
        """The default checkpoint storage (shared_fs), when no config names another."""
        return self.root / "checkpoints"

    @property
    def checkpoint_cache_dir(self) -> Path:
        """Checkpoints fetched back from storage for a trial whose run directory lacks them."""
        return (self.shared or self.root) / "checkpoint-cache"

    @property
    def experiments_dir(self) -> Path:
        return self.root / "experiments"

    def context_dir(self, experiment_uuid: str) -> Path:
        return self.experiments_dir / experiment_uuid / "context"

    def context_git_file(self, experiment_uuid: str) -> Path:
        """The git state of the submitted context (`muster.git_state`), if it had one."""
        return self.experiments_dir / experiment_uuid / "git.json"

    def context_diff_file(self, experiment_uuid: str) -> Path:
        """The context's diff against its commit, when it was dirty and the diff was sent."""
        return self.experiments_dir / experiment_uuid / "git.diff"

    def run_dir(self, trial_uuid: str) -> RunDir:
        from muster.rundir import RunDir

        return RunDir(self.runs_dir / trial_uuid)
