"""What a running server holds, and what `muster up` configures it with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from muster.checkpoint_storage.worker import StorageWorker
from muster.config import ClusterConfig, load_cluster_config
from muster.home import Home
from muster.launch.accounts import RunAs, check_can_switch
from muster.launch.base import Launcher
from muster.server.follows import FollowLimit
from muster.server.log_watch import LogWatch
from muster.server.login_limit import LoginLimiter
from muster.server.orchestrator import Orchestrator
from muster.services.allowances import Allowances
from muster.services.evidence import DumpsInFlight
from muster.store import Store


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


@dataclass
class ServerState:
    """What the routes reach through `request.app.state.muster`."""

    home: Home
    store: Store
    orchestrator: Orchestrator
    launcher: Launcher  # what serves the replicas' logs
    priority_floor: int  # the best priority a non-admin may give (cluster config)
    run_as: RunAs | None  # whom jobs run as (cluster config); None: the server's user
    storage: StorageWorker  # checkpoint uploads, GC and deletions, in its own thread
    follows: FollowLimit = field(default_factory=FollowLimit)  # open log follows per user
    log_watch: LogWatch = field(default_factory=LogWatch)  # wakes them when a log is written
    logins: LoginLimiter = field(default_factory=LoginLimiter)  # failed logins
    dumps: DumpsInFlight = field(default_factory=DumpsInFlight)  # one per trial at a time
    # What a non-admin's config may make the server act on (cluster config's allow-lists).
    allowances: Allowances = field(default_factory=Allowances)
    # Every reader reads environment build logs (cluster config `build_logs: everyone`),
    # not only their owners and admins.
    build_logs_open: bool = False
