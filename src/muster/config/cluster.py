"""The cluster config: what this machine offers the scheduler, read from YAML.

```yaml
slots: 2                 # replicas without GPUs that may run at once (default: the CPU count)
gpus: auto               # `auto` (NVML), `none`, or a fake inventory:
                         # [{index: 0, name: Fake-A100, memory: 40GiB, type: a100}]
min_free_disk: 5GiB      # no new replica starts below this much free disk; 0: no guard
log_limit: 10GiB         # each replica's log keeps its head and latest output past this
                         # (an experiment's resources.log_limit wins); off: no limit
system_metrics_interval: 10s   # each replica's CPU, memory and GPUs are sampled this often
                               # (the system/ series), 0.1s to 1h
preemption: false
gpu_release: {max_used_fraction: 0.05, timeout: 60s}
priority_floor: 10       # priorities 1-9 are admins' alone (lower runs first)
run_as: owner            # jobs run as their owner's Unix account, or {user: NAME}; none:
                         # as the server's own user (the default)
checkpoint_storage:      # every experiment's default (an experiment's own `type` wins)
  {type: s3, bucket: ckpts, access_key: env:S3_KEY, secret_key: env:S3_SECRET,
   save_trial_latest: 1, save_trial_best: 1, save_experiment_best: 0}
launcher: local          # or `ray`: replicas run on the nodes of a Ray cluster (docs/ray.md)
ray: {address: auto, namespace: muster, storage_path: /shared/muster-runs,
      placement_strategy: PACK,
      drill_network: {cut: [/usr/local/sbin/cut-link, "{node_ip}"],   # drills' `network`
                      restore: [/usr/local/sbin/restore-link, "{node_ip}"], down_for: 60s}}
node_quarantine: {failures: 3}   # Ray nodes: pulled out after 3 infra failures in a row
# What a user who is not an admin may make the server act on (docs/users.md, "What a user
# can and cannot make the server do"); admins may name anything. Each list is empty by default.
secret_sources: [env:WANDB_API_KEY, "file:/etc/muster/shared/*"]  # env:/file: sources
data_roots: [/datasets]                  # data.path outside the context, under one of these
storage_paths: [/mnt/checkpoints]        # checkpoint_storage.path, under one of these
storage_endpoints: [https://minio.lab.example:9000]   # checkpoint_storage.endpoint_url
interpreters: [/opt/conda/bin/python]    # environment.python: root-owned interpreters
package_sources: [https://pypi.lab.example/simple]    # indexes and hosts uv may fetch from
build_logs: owners                       # or `everyone`: viewers read build logs too
trusted_proxies: [127.0.0.1]             # whose X-Forwarded-For names the client
base_environment: /opt/train-venv        # what trials without an environment block import
                                         # (an interpreter or a venv; default: the runtime
                                         # base computed from muster's own installation)
mlflow: {tracking_uri: http://mlflow.lab:5000, export: on_register}   # or manual (default)
notifications:                           # who is told what (docs/how-to/team.md)
  - {url: env:SLACK_URL, events: [experiment-ended, trial-suspect], owners: [alice]}
  - {url: "https://hooks.lab.example/muster", secret: env:HOOK_KEY}   # every event, signed
notification_hosts: [chat.lab.example]   # private hosts users' own webhooks may reach
public_url: https://muster.lab.example   # the links notifications carry
quotas:                                  # limits per user and group (docs/how-to/team.md)
  {default: {max_queued_trials: 50}, users: {alice: {max_gpus: 8}},
   groups: {vision: {max_gpus: 16, max_running_trials: 8}}}
retention:                               # what ended experiments lose, and when
  {logs_after: 90d, runs_after: 180d, keep_registered: true, keep_labels: [keep]}
```

The file is optional (`$MUSTER_HOME/cluster.yaml`); its models are as strict as the
experiment config's, so a typo is an error, never a default quietly used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationInfo, field_validator, model_validator

from muster.config.loading import parse_yaml, read_config_text
from muster.config.problems import config_error, show_value, validate_config_data
from muster.config.quotas import QuotasConfig
from muster.config.schema import CheckpointStorageConfig, _Section, log_limit_or_off
from muster.config.units import format_duration, parse_duration, parse_size
from muster.priority import MAX_PRIORITY, MIN_PRIORITY
from muster.states import NotificationKind
from muster.system_metrics import DEFAULT_INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S

__all__ = ["ClusterConfig", "FakeGpuConfig", "GpuReleaseConfig", "MlflowConfig",
           "NetworkDrillConfig", "NodeQuarantineConfig", "NotificationConfig",
           "RayConfig", "RetentionConfig", "RunAsAccount", "gpu_type_from_name",
           "load_cluster_config"]

DEFAULT_MIN_FREE_DISK = 5 << 30
DEFAULT_LOG_LIMIT = 10 << 30
DEFAULT_PRIORITY_FLOOR = 10
_WHAT = "cluster config"


class FakeGpuConfig(_Section):
    """One GPU of a fake inventory, for machines without GPUs (tests, demos)."""

    index: int = Field(ge=0)
    name: str = Field(min_length=1)
    memory: int = Field(gt=0)
    # None: derived from the name, as NVML's GPUs are (`Fake-A100` -> `a100`).
    type: str | None = Field(default=None, min_length=1, validate_default=True)

    @field_validator("memory", mode="before")
    @classmethod
    def _size(cls, value: object) -> int:
        return parse_size(value)

    @field_validator("type")
    @classmethod
    def _short_lowercase(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Types compare case-insensitively, so they are kept in lowercase."""
        if value is not None:
            return value.strip().lower()
        name = info.data.get("name")
        return gpu_type_from_name(name) if isinstance(name, str) else None


_FAKE_INVENTORY = TypeAdapter(list[FakeGpuConfig])
_UNIX_NAME = r"^[a-z_][a-z0-9_-]{0,30}\$?$"


class RunAsAccount(_Section):
    """`run_as: {user: NAME}`: every job runs as this Unix account."""

    user: str = Field(min_length=1, max_length=32, pattern=_UNIX_NAME)


class GpuReleaseConfig(_Section):
    """When a GPU counts as released after its replica ended: its used memory is at most
    `max_used_fraction` of its total, waited for at most `timeout` seconds."""

    max_used_fraction: float = Field(default=0.05, ge=0, le=1)
    timeout: float = Field(default=60.0, ge=0)

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)


_Argv = list[Annotated[str, Field(min_length=1, max_length=4096)]]


class NetworkDrillConfig(_Section):
    """`ray.drill_network`: how the `network` fault of a drill (`muster drill`) cuts one Ray
    node's link and restores it, as admin commands the server runs as itself. `{node_ip}`,
    `{node_id}` and `{hostname}` in an argument become the node's, from the rank's launch
    record; `down_for` is how long the link stays cut (default 60 s).

    ```yaml
    ray:
      address: head:6379
      storage_path: /shared/muster-runs
      drill_network:
        cut: [ssh, "{node_ip}", sudo, ip, link, set, eth1, down]
        restore: [ssh, "{node_ip}", sudo, ip, link, set, eth1, up]
    ```
    """

    cut: _Argv = Field(min_length=1, max_length=64)
    restore: _Argv = Field(min_length=1, max_length=64)
    down_for: float = Field(default=60.0, ge=1.0, le=3600.0)

    @field_validator("down_for", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)


class RayConfig(_Section):
    """`ray:`: the Ray cluster `launcher: ray` runs replicas on (docs/ray.md).

    `address` is what `ray.init` takes: `auto` (a cluster this machine is a node of), a
    GCS address `host:6379`, or a Ray Client address `ray://host:10001`. `storage_path` is
    a directory every node and the server mount at that same path: run directories, the
    checkpoint cache and environments live there. `placement_strategy` is the placement
    group's: PACK (fewest nodes), SPREAD (as many as it can), STRICT_SPREAD (one node per
    replica, or wait).
    """

    address: str = Field(default="auto", min_length=1, max_length=512)
    namespace: str = Field(default="muster", min_length=1, max_length=64,
                           pattern=r"^[A-Za-z0-9_.-]+$")
    storage_path: Path
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_SPREAD"] = "PACK"
    drill_network: NetworkDrillConfig | None = None  # None: drills skip `network`

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9_.:\[\]-]+:\d{1,5}", value):
            return value
        raise ValueError("must be 'auto', a GCS address such as 'head:6379' or a Ray Client "
                         f"address such as 'ray://head:10001', got {show_value(value)}")

    @field_validator("storage_path", mode="plain")
    @classmethod
    def _absolute(cls, value: object) -> Path:
        if not isinstance(value, str) or not value.strip():
            raise ValueError("must be the absolute path of a directory every Ray node and "
                             f"the server mount, got {show_value(value)}")
        path = Path(value).expanduser()
        if not path.is_absolute():
            raise ValueError(f"must be an absolute path (the same on every node), got {value!r}")
        return path


class NodeQuarantineConfig(_Section):
    """The bad-node circuit breaker: a node on which replicas of `failures` different trials
    in a row ended INFRA, LOST or STALLED gets no new replicas until released."""

    failures: int = Field(default=3, ge=1, le=1000)


_SOURCE_PATTERN = r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:/.*)$"
_ABSOLUTE = r"^/.*$"
_URL = r"^https?://[^\s/]+(/[^\s]*)?$"
MAX_ALLOWED = 256  # entries of each allow-list


class RegistryConfig(_Section):
    """`registry:`: who may register a trial that was not verified (`--accept-unverified`,
    always marked on the version): admins, and, with `owners_accept_unverified`, the
    trial's owner too."""

    owners_accept_unverified: bool = False


class MlflowConfig(_Section):
    """`mlflow:`: the MLflow tracking server model versions are handed to (docs/how-to/
    models.md, "Export to MLflow"). `export: on_register` has the server export each newly
    registered version in the background, an event on its model either way; `manual` (the
    default), only when someone asks (`muster model export NAME@V` without --mlflow). An
    admin names this server, so muster's server may reach it; a user's own `--mlflow URI` is
    reached from the user's machine, never from the server."""

    tracking_uri: str = Field(min_length=1, max_length=2048)
    export: Literal["on_register", "manual"] = "manual"
    # Put before each muster model's name in MLflow's registry ("team-a." -> "team-a.digits").
    registered_model_prefix: str = Field(default="", max_length=64)

    @field_validator("tracking_uri")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(_URL, value):
            raise ValueError("must be the http:// or https:// URL of an MLflow tracking server,"
                             f" such as http://mlflow.lab:5000, got {show_value(value)}")
        return value.rstrip("/")

    @field_validator("registered_model_prefix")
    @classmethod
    def _name_part(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]*", value):
            raise ValueError("must be letters, digits and . _ - (MLflow's registry takes no / "
                             f"or : in a name), got {show_value(value)}")
        return value


class NotificationConfig(_Section):
    """One entry of `notifications:` (docs/how-to/team.md, "Notifications"): where to tell
    which events (`muster.notifications`). `url` and `secret` are references (`env:NAME`,
    `file:/path`, resolved at each delivery) or literal; an `http(s)` URL is muster's signed
    webhook and needs the `secret` it is signed with; any other scheme is Apprise's."""

    url: str = Field(min_length=1, max_length=2048)
    events: list[NotificationKind] = Field(default_factory=lambda: list(NotificationKind),
                                           min_length=1, max_length=len(NotificationKind))
    owners: list[Annotated[str, Field(min_length=1, max_length=32)]] = Field(
        default_factory=list, max_length=MAX_ALLOWED)
    secret: str | None = Field(default=None, min_length=1, max_length=4096)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if re.fullmatch(_SOURCE_PATTERN, value):
            return value
        if any(c.isspace() for c in value) or not re.match(r"^[a-z][a-z0-9+.-]*://", value):
            raise ValueError("must be a URL (https://… for muster's signed webhook, or an "
                             "Apprise URL such as slack://…, json://…, mailto://…) or a "
                             "reference to one: env:NAME or file:/path, got "
                             f"{show_value(value)}")
        return value

    @field_validator("events", mode="before")
    @classmethod
    def _events(cls, value: object) -> object:
        if isinstance(value, list):
            known = {k.value for k in NotificationKind}
            for word in value:
                if word not in known:
                    raise ValueError(f"{show_value(word)} is not an event to notify; use "
                                     f"some of {', '.join(sorted(known))}")
            return [NotificationKind(word) for word in value]
        return value

    @model_validator(mode="after")
    def _webhook_secret(self) -> NotificationConfig:
        if re.fullmatch(_SOURCE_PATTERN, self.url):
            return self  # what it names is known at delivery: checked there
        webhook = re.match(r"^https?://", self.url, re.IGNORECASE) is not None
        if webhook and self.secret is None:
            raise ValueError(f"{self.url.split('/', 3)[2]}: an http(s) URL is muster's signed "
                             "webhook; add `secret: env:NAME` (the key the receiver checks "
                             "signatures with), or use Apprise's json://… for an unsigned post")
        if self.secret is not None and not webhook:
            raise ValueError("`secret` signs muster's http(s) webhook; an Apprise URL "
                             "carries its own credentials: remove `secret`")
        return self


MAX_KEEP_LABELS = 64


class RetentionConfig(_Section):
    """`retention:` (docs/how-to/team.md, "Retention"): how long an ended experiment keeps
    its trials' logs (`logs_after`) and their whole runs (`runs_after`: run directories,
    checkpoints not registered, artifacts), counted from the experiment's end; each left
    out keeps them for ever. Experiments labelled with one of `keep_labels` keep
    everything; a registered model version's checkpoint keeps its trial's run
    (`keep_registered`, only its logs may go). The storage worker applies it daily
    (`muster.checkpoint_storage.retention`); its records (experiments, trials, metrics,
    events) always stay."""

    logs_after: float | None = Field(default=None, gt=0)
    runs_after: float | None = Field(default=None, gt=0)
    keep_registered: bool = True
    keep_labels: list[Annotated[str, Field(min_length=1, max_length=255)]] = Field(
        default_factory=list, max_length=MAX_KEEP_LABELS)

    @field_validator("logs_after", "runs_after", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float | None:
        return None if value is None else parse_duration(value)

    @model_validator(mode="after")
    def _logs_before_runs(self) -> RetentionConfig:
        if (self.logs_after is not None and self.runs_after is not None
                and self.logs_after > self.runs_after):
            raise ValueError(
                f"logs_after ({format_duration(self.logs_after)}) is longer than runs_after "
                f"({format_duration(self.runs_after)}), which removes the logs with the run: "
                "make logs_after at most runs_after, or leave it out")
        return self


class ClusterConfig(_Section):
    """What this machine offers: CPU slots, GPUs, the free-disk guard, preemption, and what
    users who are not admins may make the server act on (the allow-lists)."""

    slots: int | None = Field(default=None, ge=1)  # None: the CPU count, decided by the server
    gpus: Literal["auto", "none"] | list[FakeGpuConfig] = "auto"
    min_free_disk: int = Field(default=DEFAULT_MIN_FREE_DISK, ge=0)
    # What a replica's log keeps on disk when its experiment does not say (its head and its
    # latest output past it, docs/run-directory.md); None: `off`, all of it.
    log_limit: int | None = DEFAULT_LOG_LIMIT
    # How often each replica's shim samples its CPU, memory and GPUs (`muster.launch.
    # resources`): a metrics row per replica per sample.
    system_metrics_interval: float = Field(default=DEFAULT_INTERVAL_S, ge=MIN_INTERVAL_S,
                                           le=MAX_INTERVAL_S)
    preemption: bool = False
    gpu_release: GpuReleaseConfig = Field(default_factory=GpuReleaseConfig)
    # The best (lowest) priority a user who is not an admin may give a trial; better ones
    # are an admin's, so nobody jumps the queue to 1 on their own.
    priority_floor: int = Field(default=DEFAULT_PRIORITY_FLOOR, ge=MIN_PRIORITY,
                                le=MAX_PRIORITY)
    # Whom jobs run as: None, the server's own user; "owner", each experiment's owner's
    # Unix account (`muster.launch.accounts`); or one account for every job. The server
    # must run as root to drop to them.
    run_as: Literal["owner"] | RunAsAccount | None = None
    # Where checkpoints go and how many are kept when an experiment does not say
    # (`muster.checkpoint_storage.location`); None: shared_fs in $MUSTER_HOME/checkpoints, 1/1/0.
    checkpoint_storage: CheckpointStorageConfig | None = None
    # Where replicas run: this machine (`local`), or the nodes of a Ray cluster (`ray`,
    # which needs the `ray:` section and `pip install 'muster[ray]'`).
    launcher: Literal["local", "ray"] = "local"
    ray: RayConfig | None = None
    node_quarantine: NodeQuarantineConfig = Field(default_factory=NodeQuarantineConfig)
    # The allow-lists (`muster.services.allowances`): what a submitter who is not an admin
    # may name that the server itself reads, fetches, writes or runs. Admins may name
    # anything; `$MUSTER_HOME` is never allowed, whoever names it.
    # `env:NAME` or `file:/path` sources of secrets and storage keys (a path may end in `*`).
    secret_sources: list[Annotated[str, Field(pattern=_SOURCE_PATTERN, max_length=4096)]] = \
        Field(default_factory=list, max_length=MAX_ALLOWED)
    # Directories under which `data.path` may name data outside the context.
    data_roots: list[Annotated[str, Field(pattern=_ABSOLUTE, max_length=4096)]] = \
        Field(default_factory=list, max_length=MAX_ALLOWED)
    # Directories under which `checkpoint_storage.path` may be (besides this config's own).
    storage_paths: list[Annotated[str, Field(pattern=_ABSOLUTE, max_length=4096)]] = \
        Field(default_factory=list, max_length=MAX_ALLOWED)
    # `checkpoint_storage.endpoint_url`s users may name (besides this config's own).
    storage_endpoints: list[Annotated[str, Field(pattern=_URL, max_length=2048)]] = \
        Field(default_factory=list, max_length=MAX_ALLOWED)
    # `environment.python` interpreters users may name; each must be root's, in root's
    # directories, when it is used.
    interpreters: list[Annotated[str, Field(pattern=_ABSOLUTE, max_length=4096)]] = \
        Field(default_factory=list, max_length=MAX_ALLOWED)
    # Package indexes (URLs) and hosts uv may fetch from for users' environments, besides
    # the configured index.
    package_sources: list[Annotated[str, Field(min_length=1, max_length=2048)]] = \
        Field(default_factory=list, max_length=MAX_ALLOWED)
    # Who reads environment build logs: their experiments' owners and admins, or everyone.
    build_logs: Literal["owners", "everyone"] = "owners"
    # Addresses (or networks, `10.0.0.0/8`) whose `X-Forwarded-For` is believed.
    trusted_proxies: list[Annotated[str, Field(min_length=1, max_length=64)]] = \
        Field(default_factory=list, max_length=MAX_ALLOWED)
    # The interpreter or venv whose packages trials without an environment block import
    # (with muster.harness); None: the runtime base muster computes from its own
    # installation, less its own dependencies (`muster.environments.runtime_base`).
    # Checked when the server starts (`runtime_base.check_base_environment`).
    base_environment: str | None = None
    # The MLflow tracking server versions are exported to (`muster.services.mlflow_exports`);
    # None: the server exports nothing (the CLI's `--mlflow URI` still does, as the user).
    mlflow: MlflowConfig | None = None
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    # Where the server tells what happened (`muster.notifications`), and the hosts users'
    # own webhooks may reach besides public ones (names or addresses, e.g. an in-house
    # chat server).
    notifications: list[NotificationConfig] = Field(default_factory=list,
                                                    max_length=MAX_ALLOWED)
    notification_hosts: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=MAX_ALLOWED)
    # The address people open the web UI at: the links notifications carry (default: the
    # address the server listens on).
    public_url: str | None = Field(default=None, pattern=_URL, max_length=2048)
    # Limits per user, per group and for everyone else, which admission and creates
    # honour (`muster.config.quotas`; admins' runtime limits win, `muster quota`).
    quotas: QuotasConfig = Field(default_factory=QuotasConfig)
    # What ended experiments lose, and after how long (`muster.checkpoint_storage.
    # retention`); None: nothing is ever removed but by `muster experiment delete`.
    retention: RetentionConfig | None = None

    @model_validator(mode="after")
    def _ray_needs_its_section(self) -> ClusterConfig:
        if self.launcher == "ray" and self.ray is None:
            raise ValueError("launcher: ray needs a `ray:` section with at least "
                             "`storage_path:` (a directory every node and the server mount), "
                             "e.g. ray: {address: auto, storage_path: /shared/muster-runs}")
        if self.launcher == "local" and self.ray is not None:
            raise ValueError("a `ray:` section is only read with `launcher: ray`; add "
                             "`launcher: ray`, or remove the section")
        if self.launcher == "ray" and self.run_as is not None:
            raise ValueError("run_as is not supported with launcher: ray yet (jobs run as "
                             "the Ray worker's user); remove run_as")
        return self

    @field_validator("gpus", mode="plain")
    @classmethod
    def _inventory(cls, value: object) -> Literal["auto", "none"] | list[FakeGpuConfig]:
        """One clear message per shape, instead of one per member of the union."""
        if value == "auto":
            return "auto"
        if value == "none":
            return "none"
        if not isinstance(value, list):
            raise ValueError(
                "must be 'auto', 'none' or a list of fake GPUs such as "
                f"[{{index: 0, name: Fake-A100, memory: 40GiB}}], got {show_value(value)}"
            )
        # pydantic reports this ValidationError's problems under `gpus`, each at its own path.
        return _distinct_indices(_FAKE_INVENTORY.validate_python(value, strict=True))

    @field_validator("run_as", mode="plain")
    @classmethod
    def _run_as(cls, value: object) -> Literal["owner"] | RunAsAccount | None:
        if value is None or value == "owner":
            return value
        if not isinstance(value, dict):
            raise ValueError("must be 'owner' (each experiment's owner's Unix account) or "
                             f"{{user: NAME}} (one account for every job), got "
                             f"{show_value(value)}")
        return RunAsAccount.model_validate(value, strict=True)

    @field_validator("log_limit", mode="before")
    @classmethod
    def _log_limit(cls, value: object) -> int | None:
        return None if value is None else log_limit_or_off(value)

    @field_validator("min_free_disk", mode="before")
    @classmethod
    def _size(cls, value: object) -> int:
        return parse_size(value)

    @field_validator("system_metrics_interval", mode="before")
    @classmethod
    def _interval(cls, value: object) -> float:
        return parse_duration(value)

    @field_validator("base_environment", mode="plain")
    @classmethod
    def _base_environment(cls, value: object) -> str | None:
        if value is None:
            return None
        path = os.path.expanduser(value) if isinstance(value, str) else ""
        if not os.path.isabs(path) or len(path) > 4096:
            raise ValueError("must be the absolute path of a Python interpreter or a venv on "
                             f"the server, such as /opt/train-venv, got {show_value(value)}")
        return path


def _distinct_indices(specs: list[FakeGpuConfig]) -> list[FakeGpuConfig]:
    if not specs:
        raise ValueError("must list at least one fake GPU; write `gpus: none` for no GPUs")
    seen: set[int] = set()
    for spec in specs:
        if spec.index in seen:
            raise ValueError(f"GPU index {spec.index} is listed twice; each index must be unique")
        seen.add(spec.index)
    return specs


def load_cluster_config(path: Path | None, default_path: Path) -> ClusterConfig:
    """The cluster config at `path`, else at `default_path` if that exists, else defaults.

    Args:
        path: a file the person named; it must exist.
        default_path: `$MUSTER_HOME/cluster.yaml`, which may be absent.

    Raises:
        ConfigError: the file cannot be read, or its config is invalid, one problem per line.
    """
    if path is None:
        if not default_path.exists():
            return ClusterConfig()
        path = default_path
    source = os.fspath(path)
    data = parse_yaml(read_config_text(source, what=_WHAT), source)
    if data is None:  # an empty file, or only comments
        return ClusterConfig()
    if not isinstance(data, dict):
        problem = (
            "(top level): must be a mapping of keys such as 'slots:' and 'gpus:', "
            f"got {show_value(data)}"
        )
        raise config_error(source, [problem], what=_WHAT)
    return validate_config_data(ClusterConfig, data, source, what=_WHAT)


_BRANDS = frozenset({"nvidia", "tesla", "geforce", "quadro", "fake"})


def gpu_type_from_name(name: str) -> str:
    """The short lowercase type of a GPU named `name`: "NVIDIA A100-SXM4-40GB" -> "a100".

    The rule: lowercase the name and split it into words at spaces, '-' and '_'; drop the
    brand words (nvidia, tesla, geforce, quadro, fake); the type is the first word left,
    joined with the next one when it has no digit (a series, as in "RTX 4090" -> "rtx4090").
    Form factors and sizes after the model ("-SXM4-40GB", "PCIe", "80GB HBM3") are dropped.
    """
    words = [word for word in re.split(r"[\s_-]+", name.lower()) if word]
    model = [word for word in words if word not in _BRANDS] or words
    if len(model) > 1 and not any(c.isdigit() for c in model[0]):
        return model[0] + model[1]
    return model[0] if model else ""
