"""What `muster up` configures a server with, beyond its home (`open_platform` reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from muster.config import ClusterConfig, load_cluster_config
from muster.home import Home
from muster.launch.accounts import RunAs, check_can_switch

__all__ = ["ServerSettings"]


@dataclass(frozen=True)
class ServerSettings:
    """What `muster up` configures beyond the home: the store and the scheduling limits.
    `slots` and `min_free_disk` given here win over the cluster config's."""

    db_url: str | None = None  # default: SQLite in the home
    slots: int | None = None  # replicas without GPUs at once; default: the cluster config's
    min_free_disk: int | None = None  # the disk guard; default: the cluster config's
    cluster_config: str | None = None  # default: $MUSTER_HOME/cluster.yaml when it exists

    def cluster(self, home: Home) -> ClusterConfig:
        """The cluster config these settings name (raises ConfigError when invalid)."""
        path = Path(self.cluster_config).expanduser() if self.cluster_config else None
        return load_cluster_config(path, home.cluster_config_path)

    @staticmethod
    def run_as(cluster: ClusterConfig) -> RunAs | None:
        """Whom the cluster config has jobs run as, checked against this machine.

        Raises:
            AccountError: not root, or `run_as.user` is missing or root.
        """
        if cluster.run_as is None:
            return None
        check_can_switch()
        if cluster.run_as == "owner":
            return RunAs(owner=True)
        run_as = RunAs(account=cluster.run_as.user)
        run_as.account_for(None, None)  # that account exists, and is not root
        return run_as
