"""The JSON of what the launcher and the shim hand each other through the run directory:
the replica's spec (`RankFiles.spec`) and its exit record (`RankFiles.exit`).

One module for both sides, so the launcher never imports the shim program to read its
files, and the shim never imports the launcher.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast, get_args

from muster.launch.accounts import AccountJson, account_from_json
from muster.launch.base import ExitRecord, MemoryEnforcement, OomKill, ReplicaSpec
from muster.states import OomSource
from muster.system_metrics import DEFAULT_INTERVAL_S

__all__ = ["ExitRecordJson", "OomKillJson", "ReplicaSpecJson", "exit_record_from_json",
           "exit_record_to_json", "spec_from_json", "spec_to_json"]


class ReplicaSpecJson(TypedDict):
    """`RankFiles.spec`: a `ReplicaSpec` as JSON. The keys a spec written before a field
    existed lacks are NotRequired (their reader's default says what such a spec meant)."""

    trial_uuid: str
    attempt: int
    rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    attempt_dir: str
    stop_grace: float
    memory_limit: NotRequired[int | None]
    memory_enforcement: NotRequired[str]
    log_limit: NotRequired[int | None]
    notify: NotRequired[list[int] | None]  # [pid, start_ticks]
    path: NotRequired[list[str] | None]
    account: NotRequired[AccountJson | None]
    distributed: NotRequired[bool]
    gpus: NotRequired[list[int] | None]
    system_metrics_interval: NotRequired[float]


class OomKillJson(TypedDict):
    source: str  # an `OomSource` value
    limit_bytes: int | None
    machine_bytes: int | None


class ExitRecordJson(TypedDict, total=False):
    """`RankFiles.exit`: an `ExitRecord` as JSON. Not total: records written before a field
    existed lack it, and `oom` was a bool before issue 31."""

    returncode: int | None
    exit_code: int | None
    signal: str | None
    pid: int | None
    start_ticks: int | None
    started_at: float | None
    ended_at: float
    max_rss_bytes: int | None
    stop_requested: bool
    signals_sent: list[str]
    spawn_error: str | None
    spawn_errno: int | None
    log_bytes: int
    oom: OomKillJson | bool | None
    memory_limit_bytes: int | None
    peak_memory_bytes: int | None
    memory_enforcement: str | None
    memory_error: str | None
    peak_rss_bytes: int | None
    log_lost_bytes: int
    log_lost_error: str | None
    log_dropped_bytes: int
    log_limit_bytes: int | None


def spec_to_json(spec: ReplicaSpec) -> ReplicaSpecJson:
    """The spec as JSON-ready data (paths as strings)."""
    return ReplicaSpecJson(
        trial_uuid=spec.trial_uuid, attempt=spec.attempt, rank=spec.rank,
        argv=list(spec.argv), env=dict(spec.env), cwd=str(spec.cwd),
        attempt_dir=str(spec.attempt_dir), stop_grace=spec.stop_grace,
        memory_limit=spec.memory_limit, memory_enforcement=spec.memory_enforcement,
        log_limit=spec.log_limit,
        notify=list(spec.notify) if spec.notify else None,
        path=list(spec.path) if spec.path is not None else None,
        account=spec.account.to_json() if spec.account is not None else None,
        distributed=spec.distributed,
        gpus=list(spec.gpus) if spec.gpus is not None else None,
        system_metrics_interval=spec.system_metrics_interval)


def spec_from_json(data: ReplicaSpecJson) -> ReplicaSpec:
    """The inverse of `spec_to_json`."""
    return ReplicaSpec(
        trial_uuid=str(data["trial_uuid"]),
        attempt=int(data["attempt"]),
        rank=int(data["rank"]),
        argv=[str(arg) for arg in data["argv"]],
        env={str(k): str(v) for k, v in data["env"].items()},
        cwd=Path(data["cwd"]),
        attempt_dir=Path(data["attempt_dir"]),
        stop_grace=float(data["stop_grace"]),
        # Specs written before memory limits existed have neither key.
        memory_limit=_optional_int(data.get("memory_limit")),
        memory_enforcement=_enforcement(data.get("memory_enforcement", "auto")),
        log_limit=_optional_int(data.get("log_limit")),
        notify=_notify_target(data.get("notify")),
        path=_directories(data.get("path")),
        account=account_from_json(data.get("account")),  # absent before run_as existed
        # Absent before distributed_env existed, when every replica had torchrun's variables.
        distributed=bool(data.get("distributed", True)),
        # Both absent before the system/ series existed.
        gpus=_indices(data.get("gpus")),
        system_metrics_interval=float(data.get("system_metrics_interval",
                                               DEFAULT_INTERVAL_S)),
    )


def exit_record_to_json(record: ExitRecord) -> ExitRecordJson:
    # asdict gives every field under its own name: the TypedDict's keys, by the table test.
    data = cast(ExitRecordJson, dataclasses.asdict(record))
    if record.oom is not None:
        data["oom"] = OomKillJson(source=record.oom.source,
                                  limit_bytes=record.oom.limit_bytes,
                                  machine_bytes=record.oom.machine_bytes)
    return data


def exit_record_from_json(data: ExitRecordJson) -> ExitRecord:
    """Parse an exit record; unknown keys (from a newer shim) are ignored."""
    names = {f.name for f in dataclasses.fields(ExitRecord)} - {"oom"}
    fields = {k: v for k, v in data.items() if k in names}
    # ExitRecordJson names ExitRecord's fields with their types (the table test holds it).
    return ExitRecord(**cast(Mapping[str, Any], fields), oom=_oom_kill(data))


def _oom_kill(data: ExitRecordJson) -> OomKill | None:
    """The record's `oom`: an object since issue 31; a bool before, when only a memory limit
    could name an OOM (its mechanism says who: the cgroup or the watchdog)."""
    value = data.get("oom")
    if isinstance(value, dict):
        machine = value.get("machine_bytes")
        return OomKill(OomSource(value["source"]), _optional_int(value.get("limit_bytes")),
                       _optional_int(machine))
    if value is True:
        watchdog = data.get("memory_enforcement") == OomSource.WATCHDOG
        return OomKill(OomSource.WATCHDOG if watchdog else OomSource.CGROUP,
                       _optional_int(data.get("memory_limit_bytes")))
    return None


def _indices(value: list[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(i) for i in value)


def _directories(value: list[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(str(p) for p in value)


def _optional_int(value: object) -> int | None:
    return None if value is None else int(cast(int, value))


def _notify_target(value: object) -> tuple[int, int] | None:
    if value is None:
        return None
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        return value[0], value[1]
    raise ValueError(f"notify must be [pid, start_ticks] or null, got {value!r}")


def _enforcement(value: object) -> MemoryEnforcement:
    for known in get_args(MemoryEnforcement):
        if value == known:
            return cast(MemoryEnforcement, known)
    raise ValueError(f"memory_enforcement must be auto, cgroup or watchdog, got {value!r}")
