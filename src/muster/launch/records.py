"""The JSON of what the launcher and the shim hand each other through the run directory:
the replica's spec (`RankFiles.spec`) and its exit record (`RankFiles.exit`).

One module for both sides, so the launcher never imports the shim program to read its
files, and the shim never imports the launcher.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast, get_args

from muster.launch.accounts import account_from_json
from muster.launch.base import ExitRecord, MemoryEnforcement, OomKill, ReplicaSpec
from muster.states import OomSource

__all__ = ["exit_record_from_json", "exit_record_to_json", "spec_from_json", "spec_to_json"]


def spec_to_json(spec: ReplicaSpec) -> dict[str, Any]:
    """The spec as JSON-ready data (paths as strings)."""
    data = dataclasses.asdict(spec)
    data["cwd"] = str(spec.cwd)
    data["attempt_dir"] = str(spec.attempt_dir)
    data["notify"] = list(spec.notify) if spec.notify else None
    data["path"] = list(spec.path) if spec.path is not None else None
    data["account"] = spec.account.to_json() if spec.account is not None else None
    return data


def spec_from_json(data: dict[str, Any]) -> ReplicaSpec:
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
        memory_limit=None if data.get("memory_limit") is None else int(data["memory_limit"]),
        memory_enforcement=_enforcement(data.get("memory_enforcement", "auto")),
        log_limit=None if data.get("log_limit") is None else int(data["log_limit"]),
        notify=_notify_target(data.get("notify")),
        path=None if data.get("path") is None else tuple(str(p) for p in data["path"]),
        account=account_from_json(data.get("account")),  # absent before run_as existed
        # Absent before distributed_env existed, when every replica had torchrun's variables.
        distributed=bool(data.get("distributed", True)),
    )


def exit_record_to_json(record: ExitRecord) -> dict[str, Any]:
    data = dataclasses.asdict(record)
    if record.oom is not None:
        data["oom"] = data["oom"] | {"source": record.oom.source.value}
    return data


def exit_record_from_json(data: dict[str, Any]) -> ExitRecord:
    """Parse an exit record; unknown keys (from a newer shim) are ignored."""
    names = {f.name for f in dataclasses.fields(ExitRecord)}
    fields = {k: v for k, v in data.items() if k in names}
    fields["oom"] = _oom_kill(data)
    return ExitRecord(**fields)


def _oom_kill(data: dict[str, Any]) -> OomKill | None:
    """The record's `oom`: an object since issue 31; a bool before, when only a memory limit
    could name an OOM (its mechanism says who: the cgroup or the watchdog)."""
    value = data.get("oom")
    if isinstance(value, dict):
        machine = value.get("machine_bytes")
        return OomKill(OomSource(value["source"]), _optional_int(value.get("limit_bytes")),
                       _optional_int(machine))
    if value is True:
        watchdog = data.get("memory_enforcement") == OomSource.WATCHDOG.value
        return OomKill(OomSource.WATCHDOG if watchdog else OomSource.CGROUP,
                       _optional_int(data.get("memory_limit_bytes")))
    return None


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
