"""The JSON shapes of the run-directory records name exactly their dataclasses' fields, so a
field added to one and not the other fails here rather than on a trial's exit."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import get_type_hints

import pytest

from muster.launch.accounts import Account, AccountJson
from muster.launch.base import ExitRecord, OomKill, ReplicaSpec
from muster.launch.records import (
    ExitRecordJson,
    OomKillJson,
    ReplicaSpecJson,
    exit_record_from_json,
    exit_record_to_json,
    spec_from_json,
    spec_to_json,
)
from muster.states import OomSource


@pytest.mark.parametrize(("shape", "record"), [
    (ReplicaSpecJson, ReplicaSpec), (ExitRecordJson, ExitRecord), (OomKillJson, OomKill),
    (AccountJson, Account),
])
def test_a_json_shape_names_its_records_fields(shape: type, record: type) -> None:
    assert set(get_type_hints(shape)) == {f.name for f in dataclasses.fields(record)}


def test_a_spec_and_an_exit_record_survive_json() -> None:
    account = Account("job", 1000, 1000, (1000, 27), "/home/job")
    spec = ReplicaSpec("uuid", 2, 1, ["python", "train.py"], {"A": "1"}, Path("/w"),
                       Path("/w/attempt-2"), notify=(10, 20), path=("/env/bin",),
                       account=account, memory_limit=1 << 30, distributed=False,
                       gpus=(2, 3), system_metrics_interval=0.5)
    assert spec_from_json(json.loads(json.dumps(spec_to_json(spec)))) == spec
    record = ExitRecord(returncode=-9, exit_code=137, signal="SIGKILL", pid=5,
                        start_ticks=6, started_at=1.0, ended_at=2.0, max_rss_bytes=None,
                        signals_sent=["SIGTERM"], oom=OomKill(OomSource.CGROUP, 1 << 30, 1 << 34))
    assert exit_record_from_json(json.loads(json.dumps(exit_record_to_json(record)))) == record
