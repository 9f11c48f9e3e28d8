"""The storage worker on real trials: checkpoints uploaded, verified, garbage-collected by
the policy, deleted with an event each, and fetched back for a restart that lacks them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.checkpoint_files import METADATA_FILE, published, sharded_name
from muster.checkpoint_storage.worker import StorageWorker
from muster.services.experiments import create_experiment
from muster.store import Checkpoint, Event, Trial
from tests.supervise.conftest import FIXTURES, Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def _submit(rig: Rig, values: str, storage: dict[str, Any], *args: str) -> tuple[int, int]:
    config = {"name": "ckpt", "harness": True,
              "entrypoint": [sys.executable, str(FIXTURES / "checkpoint_series.py"), values,
                             *args],
              "failure_policy": {"stop_grace": 1.0},
              "searcher": {"name": "single", "metric": "val_loss"},
              "checkpoint_storage": storage}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return experiment_id, trial_id


def _drain(worker: StorageWorker) -> None:
    for _ in range(50):
        if not worker.run_once():
            return
    raise AssertionError("the storage worker still had work after 50 rounds")


def _rows(rig: Rig, trial_id: int) -> dict[int, tuple[str, str, str | None]]:
    with rig.store.session_scope() as s:
        return {c.step: (c.state, c.uuid, c.gc_reason) for c in s.scalars(
            select(Checkpoint).where(Checkpoint.trial_id == trial_id))}


def test_the_policy_keeps_the_latest_and_the_best_in_storage_and_on_disk(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    experiment_id, trial_id = _submit(sqlite_rig, "0.5,0.2,0.4,0.3,0.6",
                                      {"type": "shared_fs", "path": str(storage)})
    trial = sqlite_rig.run_to_end_of(experiment_id, trial_id)
    assert trial.state == "SUCCEEDED"
    worker = StorageWorker(sqlite_rig.store, sqlite_rig.home)
    worker.recover()
    _drain(worker)
    rows = _rows(sqlite_rig, trial_id)
    assert {step: state for step, (state, _, _) in rows.items()} == {
        1: "deleted", 2: "stored", 3: "deleted", 4: "deleted", 5: "stored"}
    assert "best 1 (metric 0.2 at step 2)" in (rows[2][2] or "")
    assert "latest 1" in (rows[5][2] or "")
    kept = {rows[2][1], rows[5][1]}
    assert {p.name for p in storage.iterdir()} == kept
    for uuid in kept:
        assert (storage / uuid / METADATA_FILE).is_file()
        assert (storage / uuid / "nested" / "step.txt").is_file()
    run_dir = sqlite_rig.home.run_dir(_trial_uuid(sqlite_rig, trial_id))
    assert sorted(int(p.name.split("-")[1]) for p in published(run_dir.checkpoints)) == [2, 5]
    with sqlite_rig.store.session_scope() as s:
        deleted = s.scalars(select(Event.message).where(
            Event.trial_id == trial_id, Event.reason == "checkpoint deleted")).all()
    assert len(deleted) == 3 and all("not among trial" in m for m in deleted)
    _drain(worker)  # idempotent: a second collection changes nothing
    assert _rows(sqlite_rig, trial_id) == rows


def _trial_uuid(rig: Rig, trial_id: int) -> str:
    with rig.store.session_scope() as s:
        return s.get_one(Trial, trial_id).uuid


def test_s3_storage_round_trip(sqlite_rig: Rig, s3_endpoint: str, s3_bucket: str,
                               s3_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_S3_KEY", "testing")
    monkeypatch.setenv("TEST_S3_SECRET", "testing")
    storage = {"type": "s3", "bucket": s3_bucket, "prefix": "exp", "endpoint_url": s3_endpoint,
               "region": "us-east-1", "access_key": "env:TEST_S3_KEY",
               "secret_key": "env:TEST_S3_SECRET", "save_trial_best": 0}
    experiment_id, trial_id = _submit(sqlite_rig, "0.5,0.2,0.4", storage, "--size", "100000")
    sqlite_rig.run_to_end_of(experiment_id, trial_id)
    worker = StorageWorker(sqlite_rig.store, sqlite_rig.home)
    _drain(worker)
    rows = _rows(sqlite_rig, trial_id)
    assert [rows[s][0] for s in (1, 2, 3)] == ["deleted", "deleted", "stored"]
    keys = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    uuid = rows[3][1]
    assert keys == [f"exp/{uuid}/{METADATA_FILE}", f"exp/{uuid}/model.bin",
                    f"exp/{uuid}/nested/step.txt"]


def _registered(rig: Rig, trial_id: int, steps: int) -> None:
    rig.tick_until(lambda: len(_rows(rig, trial_id)) >= steps,
                   what=f"{steps} checkpoints of trial {trial_id} to be registered")


def _crash_training(rig: Rig, trial_id: int) -> None:
    """SIGKILL the training process of the trial's running attempt (a machine lost)."""
    run_dir = rig.home.run_dir(_trial_uuid(rig, trial_id))
    status = json.loads(run_dir.attempt(1).rank(0).status.read_text())
    os.killpg(status["pgid"], signal.SIGKILL)


def _second_attempt_log(rig: Rig, trial_id: int) -> str:
    return rig.home.run_dir(_trial_uuid(rig, trial_id)).attempt(2).rank(0).log.read_text()


@pytest.mark.parametrize("kind", ["shared_fs", "s3"])
@pytest.mark.parametrize("corrupt", [False, True], ids=["intact", "corrupt-in-storage"])
def test_a_restart_without_the_local_files_resumes_from_storage(
        sqlite_rig: Rig, tmp_path: Path, corrupt: bool, kind: str,
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run directory lost its checkpoints (another machine, a lost disk): the next
    attempt resumes from the copy in storage, verified; a copy corrupt in storage (a file
    overwritten in the directory, an object replaced in the bucket) is skipped with an event
    naming it, and the one before it is used."""
    storage, pace = tmp_path / "storage", tmp_path / "pace"
    pace.mkdir()
    (pace / "go-1").touch()
    (pace / "go-2").touch()
    where: dict[str, Any] = {"type": "shared_fs", "path": str(storage)}
    if kind == "s3":
        monkeypatch.setenv("TEST_S3_KEY", "testing")
        monkeypatch.setenv("TEST_S3_SECRET", "testing")
        bucket = request.getfixturevalue("s3_bucket")
        where = {"type": "s3", "bucket": bucket, "prefix": "restore",
                 "endpoint_url": request.getfixturevalue("s3_endpoint"),
                 "region": "us-east-1", "access_key": "env:TEST_S3_KEY",
                 "secret_key": "env:TEST_S3_SECRET"}
    experiment_id, trial_id = _submit(sqlite_rig, "0.5,0.4,0.3",
                                      {**where, "save_trial_latest": 2},
                                      "--wait-for", str(pace))
    _registered(sqlite_rig, trial_id, 2)
    worker = StorageWorker(sqlite_rig.store, sqlite_rig.home)
    _drain(worker)
    rows = _rows(sqlite_rig, trial_id)
    assert [rows[1][0], rows[2][0]] == ["stored", "stored"]
    run_dir = sqlite_rig.home.run_dir(_trial_uuid(sqlite_rig, trial_id))
    for local in published(run_dir.checkpoints):
        shutil.rmtree(local)
    if corrupt and kind == "s3":
        request.getfixturevalue("s3_client").put_object(
            Bucket=where["bucket"], Key=f"restore/{rows[2][1]}/model.bin",
            Body=b"not what was saved")
    elif corrupt:
        (storage / rows[2][1] / "model.bin").write_bytes(b"not what was saved")
    _crash_training(sqlite_rig, trial_id)
    (pace / "go-3").touch()
    trial = sqlite_rig.run_to_end_of(experiment_id, trial_id)
    assert trial.state == "SUCCEEDED", trial
    resumed = 1 if corrupt else 2
    assert f"resumed from step {resumed} (step-{resumed:012d}-" in _second_attempt_log(
        sqlite_rig, trial_id)
    with sqlite_rig.store.session_scope() as s:
        skipped = s.scalars(select(Event.message).where(
            Event.trial_id == trial_id, Event.reason == "restore skipped")).all()
    if corrupt:
        [message] = skipped
        assert rows[2][1] in message and "model.bin does not match its sha256" in message
    else:
        assert skipped == []


def test_collection_during_a_long_run_keeps_its_disk_bounded(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    """Each stored checkpoint is followed by a collection: while the trial runs, its run
    directory and storage hold the latest and the best, never all it saved; the latest is
    kept even when the policy keeps nothing (the trial may still resume from it)."""
    storage, pace = tmp_path / "storage", tmp_path / "pace"
    pace.mkdir()
    values = [0.9, 0.1, 0.8, 0.7, 0.6, 0.5]
    experiment_id, trial_id = _submit(
        sqlite_rig, ",".join(map(str, values)),
        {"type": "shared_fs", "path": str(storage), "save_trial_best": 0,
         "save_trial_latest": 0}, "--wait-for", str(pace))
    worker = StorageWorker(sqlite_rig.store, sqlite_rig.home)
    run_dir = sqlite_rig.home.run_dir(_trial_uuid(sqlite_rig, trial_id))
    for step in range(1, len(values)):  # the last step ends the trial: see below
        (pace / f"go-{step}").touch()
        _registered(sqlite_rig, trial_id, step)
        _drain(worker)
        local = [int(p.name.split("-")[1]) for p in published(run_dir.checkpoints)]
        assert local == [step], (step, local)  # the resume point only
        assert len(list(storage.iterdir())) == 1
    old, young = _saves_in_progress(run_dir.checkpoints)
    assert worker.remove_abandoned_saves() == 0  # attempt 1 runs: they may be written now
    (pace / f"go-{len(values)}").touch()
    trial = sqlite_rig.run_to_end_of(experiment_id, trial_id)
    assert trial.state == "SUCCEEDED"
    _drain(worker)  # ended: nothing protects it any more, and the policy keeps 0
    assert published(run_dir.checkpoints) == [] and list(storage.iterdir()) == []
    assert worker.sweep().saves_removed == 1  # nobody writes them now; the young one waits
    assert not old.exists() and young.is_dir()
    assert {state for state, _, _ in _rows(sqlite_rig, trial_id).values()} == {"deleted"}


def _saves_in_progress(folder: Path) -> tuple[Path, Path]:
    """Two sharded saves of attempt 1 in progress: one untouched for an hour, one fresh."""
    old, young = (folder / sharded_name(9, attempt=1, number=n) for n in (1, 2))
    for path in (old, young):
        path.mkdir()
        (path / "shard-0").write_bytes(b"half")
    an_hour_ago = time.time() - 3600
    for path in (old / "shard-0", old):
        os.utime(path, (an_hour_ago, an_hour_ago))
    return old, young
