"""The platform: what one muster server is made of, made once, by `open_platform`.

`create_app` makes it and `ServerState` holds it. Routes hand it to the services whole, or
as the narrow protocol a service declares (`muster.services.cluster.ClusterView`,
`muster.services.experiments.Submission`); none of them reaches into the supervisor, whose
passes the orchestrator alone runs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass

from muster.atomic import read_json
from muster.checkpoint_storage.worker import StorageWorker
from muster.config import ClusterConfig
from muster.config.quotas import QuotasConfig
from muster.environments.interpreters import InterpreterError
from muster.environments.registry import Environments
from muster.environments.runtime_base import RuntimeBase, check_base_environment
from muster.errors import ConfigError
from muster.home import Home
from muster.launch.accounts import RunAs
from muster.launch.base import Launcher
from muster.notifications import (
    Router,
    TargetError,
    check_apprise_url,
    is_reference,
    webhook_url,
)
from muster.notifier import Notifier
from muster.schedule.backends import open_placement
from muster.schedule.placement import Placement
from muster.server.drill_runner import DrillRunner
from muster.server.launchers import open_launcher
from muster.server.settings import ServerSettings
from muster.services import warm_starts
from muster.services.allowances import Allowances
from muster.services.cluster import submission_capacity
from muster.services.experiments import AdmitNew, SourceResolver
from muster.services.mlflow_exports import ExportQueue
from muster.services.submission import ClusterCapacity
from muster.store import Store
from muster.supervise.supervisor import Supervisor

__all__ = ["Platform", "open_platform"]


@dataclass
class Platform:
    """The parts of one server, each made once; what the routes and services reach."""

    home: Home
    settings: ClusterConfig  # the cluster config in force
    store: Store
    launcher: Launcher  # runs the replicas, and serves their logs
    # Where replicas go: the slots, the GPU pool over the inventory, the nodes.
    placement: Placement
    envs: Environments  # environments built for experiments, and the runtime base
    storage: StorageWorker  # checkpoint uploads, GC and deletions, in its own thread
    supervisor: Supervisor  # its passes: the orchestrator's alone
    run_as: RunAs | None  # whom jobs run as (cluster config); None: the server's user
    min_free_disk: int  # the disk guard: nothing launches with less free in the runs
    # What a non-admin's config may make the server act on (cluster config's allow-lists).
    allowances: Allowances
    # The background exports of newly registered versions to the cluster config's MLflow
    # (`mlflow: {export: on_register}`); None: none are made when versions are registered.
    mlflow_exports: ExportQueue | None = None
    # Delivers the notifications the store's outbox holds (`muster.notifier`); None: a
    # platform made without one (its outbox rows wait for the next server that has one).
    notifier: Notifier | None = None
    # Runs drills (`muster.drill.runner`), in its own thread; None: a platform made without
    # one (its drills wait for the next server that has one).
    drills: DrillRunner | None = None

    @property
    def priority_floor(self) -> int:
        """The best priority a non-admin may give (cluster config)."""
        return self.settings.priority_floor

    @property
    def build_logs_open(self) -> bool:
        """Every reader reads environment build logs, not only their owners and admins
        (cluster config `build_logs: everyone`)."""
        return self.settings.build_logs == "everyone"

    @property
    def owners_accept_unverified(self) -> bool:
        """A trial's owner may register it unverified, with a reason (cluster config
        `registry: {owners_accept_unverified: true}`); else only admins."""
        return self.settings.registry.owners_accept_unverified

    @property
    def quotas(self) -> QuotasConfig:
        """The cluster config's quotas (admins' runtime limits are in the store)."""
        return self.settings.quotas

    @property
    def runtime(self) -> RuntimeBase:
        """The base of trials without an environment, and of environments that inherit."""
        return self.envs.runtime

    def slots_in_use(self) -> int:
        """One slot per replica without GPUs of every trial that holds its resources."""
        return self.supervisor.slots_in_use()

    def capacity(self) -> ClusterCapacity:
        """What a submitted trial's demand is compared with."""
        return submission_capacity(self)

    def admitting(self, priority: int) -> ContextManager[AdmitNew | None]:
        """Admission at submission: `Supervisor.admitting_new`."""
        return self.supervisor.admitting_new(priority)

    @property
    def sources(self) -> SourceResolver:
        """What resolves a config's warm start at submission (`warm_starts`)."""
        return warm_starts.resolve_source

    def start(self) -> None:
        """Start what works beside the passes: the runtime base's build (what the first
        trial without an environment needs), the checkpoint storage worker, the MLflow
        exports of `on_register`, and the notifier."""
        self.envs.runtime.start()
        self.storage.start()
        if self.mlflow_exports is not None:
            self.mlflow_exports.start()
        if self.notifier is not None:
            self.notifier.start()
        if self.drills is not None:
            self.drills.start()

    def close(self) -> None:
        """Stop it all; trials run on, for the next server to reattach."""
        self.storage.stop()
        if self.mlflow_exports is not None:
            self.mlflow_exports.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.drills is not None:
            self.drills.stop()
        self.envs.stop_all()  # a build half done is redone by the next server
        self.store.dispose()
        self.placement.close()


def open_platform(home: Home, settings: ServerSettings) -> Platform:
    """The platform `settings` and the cluster config they name describe, for `home`.

    Raises:
        ConfigError: the cluster config is invalid, or its `run_as` cannot be met here.
    """
    cluster = settings.cluster(home)
    run_as = settings.run_as(cluster)
    _check_base_environment(cluster.base_environment, run_as is not None)
    launcher, home = open_launcher(cluster, home)
    home.ensure(jobs_enter=run_as is not None)
    _check_notifications(cluster)
    store = Store(settings.db_url or home.default_db_url)
    notifier = Notifier(store, cluster.notifications, allowed_hosts=cluster.notification_hosts,
                        link_base=lambda: cluster.public_url or _server_url(home))
    Router(cluster.notifications, on_queued=notifier.wake).install(store)
    placement = open_placement(launcher, store, cluster, home, slots=settings.slots)
    envs = Environments(home.envs_dir, shared=run_as is not None,
                        base_environment=cluster.base_environment)
    min_free_disk = (settings.min_free_disk if settings.min_free_disk is not None
                     else cluster.min_free_disk)
    supervisor = Supervisor(
        store=store, launcher=launcher, home=home, placement=placement,
        min_free_disk=min_free_disk, preemption=cluster.preemption, run_as=run_as,
        quarantine_after=cluster.node_quarantine.failures, log_limit=cluster.log_limit,
        system_metrics_interval=cluster.system_metrics_interval,
        quotas=cluster.quotas, environments=envs)
    platform = Platform(
        home=home, settings=cluster, store=store, launcher=launcher, placement=placement,
        envs=envs, storage=StorageWorker(store, home, cluster.checkpoint_storage,
                                         retention=cluster.retention),
        supervisor=supervisor, run_as=run_as, min_free_disk=min_free_disk,
        allowances=Allowances.of(cluster),
        mlflow_exports=(ExportQueue(store, home, cluster.mlflow) if cluster.mlflow is not None
                        and cluster.mlflow.export == "on_register" else None),
        notifier=notifier)
    platform.drills = DrillRunner(store, home, platform)
    return platform


def _check_notifications(cluster: ClusterConfig) -> None:
    """The cluster config's literal Apprise URLs, parsed by Apprise before anything starts
    (references are resolved, and checked, at each delivery).

    Raises:
        ConfigError: one Apprise cannot parse.
    """
    for number, entry in enumerate(cluster.notifications):
        if is_reference(entry.url) or webhook_url(entry.url):
            continue
        try:
            check_apprise_url(entry.url)
        except TargetError as exc:
            raise ConfigError(f"notifications[{number}] in the cluster config: {exc}") from exc


def _server_url(home: Home) -> str:
    """The address `muster up` wrote it listens on ("" before it did)."""
    found = read_json(home.server_file)
    url = found.get("url") if isinstance(found, dict) else None
    return url if isinstance(url, str) else ""


def _check_base_environment(path: str | None, run_as: bool) -> None:
    """The cluster config's `base_environment`, checked before anything starts.

    Raises:
        ConfigError: it is not an interpreter (or venv) muster can use.
    """
    if path is None:
        return
    try:
        check_base_environment(path, run_as=run_as)
    except InterpreterError as exc:
        raise ConfigError(f"base_environment in the cluster config cannot be used: {exc}; "
                          "name a Python 3 interpreter or a venv, or remove it (trials then "
                          "run on the runtime base muster computes)") from exc
