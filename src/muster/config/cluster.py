"""The cluster config: what this machine offers the scheduler, read from YAML.

```yaml
slots: 2                 # replicas without GPUs that may run at once (default: the CPU count)
gpus: auto               # `auto` (NVML), `none`, or a fake inventory:
                         # [{index: 0, name: Fake-A100, memory: 40GiB, type: a100}]
min_free_disk: 5GiB      # no new replica starts below this much free disk; 0: no guard
preemption: false
gpu_release: {max_used_fraction: 0.05, timeout: 60s}
priority_floor: 10       # priorities 1-9 are admins' alone (lower runs first)
run_as: owner            # jobs run as their owner's Unix account, or {user: NAME}; none:
                         # as the server's own user (the default)
checkpoint_storage:      # every experiment's default (an experiment's own `type` wins)
  {type: s3, bucket: ckpts, access_key: env:S3_KEY, secret_key: env:S3_SECRET,
   save_trial_latest: 1, save_trial_best: 1, save_experiment_best: 0}
```

The file is optional (`$MUSTER_HOME/cluster.yaml`); its models are as strict as the
experiment config's, so a typo is an error, never a default quietly used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, TypeAdapter, ValidationInfo, field_validator

from muster.config.loading import parse_yaml, read_config_text
from muster.config.problems import config_error, show_value, validate_config_data
from muster.config.schema import MAX_PRIORITY, MIN_PRIORITY, CheckpointStorageConfig, _Section
from muster.config.units import parse_duration, parse_size

__all__ = ["ClusterConfig", "FakeGpuConfig", "GpuReleaseConfig", "RunAsAccount",
           "gpu_type_from_name", "load_cluster_config"]

DEFAULT_MIN_FREE_DISK = 5 << 30
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


class ClusterConfig(_Section):
    """What this machine offers: CPU slots, GPUs, the free-disk guard, preemption."""

    slots: int | None = Field(default=None, ge=1)  # None: the CPU count, decided by the server
    gpus: Literal["auto", "none"] | list[FakeGpuConfig] = "auto"
    min_free_disk: int = Field(default=DEFAULT_MIN_FREE_DISK, ge=0)
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
    # (`muster.storage.location`); None: shared_fs in $MUSTER_HOME/checkpoints, 1/1/0.
    checkpoint_storage: CheckpointStorageConfig | None = None

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

    @field_validator("min_free_disk", mode="before")
    @classmethod
    def _size(cls, value: object) -> int:
        return parse_size(value)


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
