"""Artifact sets in checkpoint storage, on shared_fs and on S3 (moto's real API): a real
trial's artifacts copied and uploaded by the storage worker like a checkpoint (metadata.json
last), served from storage byte-exact once the run directory lost them, and removed from
storage with their experiment."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.checkpoint_files import METADATA_FILE
from muster.checkpoint_storage.location import Location, open_backend
from muster.checkpoint_storage.worker import StorageWorker
from muster.services import artifacts, retention
from muster.services.experiments import create_experiment
from muster.store import ArtifactSet, Experiment, Trial
from tests.supervise.conftest import Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

SCRIPT = """\
from pathlib import Path

Path("eval").mkdir()
Path("eval/report.json").write_text('{"accuracy": 0.97}')
Path("model.pt").write_bytes(bytes(range(256)) * 4096)
"""


@pytest.fixture(params=["shared_fs", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    if request.param == "shared_fs":
        return {"type": "shared_fs", "path": str(tmp_path / "storage")}
    monkeypatch.setenv("TEST_S3_KEY", "testing")
    monkeypatch.setenv("TEST_S3_SECRET", "testing")
    return {"type": "s3", "bucket": request.getfixturevalue("s3_bucket"), "prefix": "exp",
            "endpoint_url": request.getfixturevalue("s3_endpoint"), "region": "us-east-1",
            "access_key": "env:TEST_S3_KEY", "secret_key": "env:TEST_S3_SECRET"}


def _drain(worker: StorageWorker) -> None:
    for _ in range(50):
        if not worker.run_once():
            return
    raise AssertionError("the storage worker still had work after 50 rounds")


def test_a_set_is_stored_served_from_storage_and_deleted_with_its_experiment(
        sqlite_rig: Rig, storage: dict[str, Any], tmp_path: Path) -> None:
    rig = sqlite_rig
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    config = {"name": "artifacts", "entrypoint": [sys.executable, str(script)],
              "artifacts": ["model.pt", "eval/"], "checkpoint_storage": storage}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
        trial_uuid = s.get_one(Trial, trial_id).uuid
    assert rig.run_to_end_of(experiment_id, trial_id).state == "SUCCEEDED"
    worker = StorageWorker(rig.store, rig.home)
    worker.recover()
    _drain(worker)

    found = artifacts.trial_artifacts(rig.store, trial_id)
    assert (found["state"], found["storage_state"], found["error"]) == (
        "collected", "stored", None), (found["skipped"], found["message"])
    assert found["skipped"] == []  # a script done before a pass saw it run: its files count
    with rig.store.session_scope() as s:
        row = s.scalars(select(ArtifactSet).where(ArtifactSet.trial_id == trial_id)).one()
        uuid, location = row.uuid, Location.from_json(row.storage or {})
    assert found["storage_url"] == location.url(uuid)
    backend = open_backend(location, rig.home.root)
    keys = sorted(o.key for o in backend.list(f"{uuid}/"))
    assert keys == [f"{uuid}/eval/report.json", f"{uuid}/{METADATA_FILE}", f"{uuid}/model.pt"]

    workdir = rig.home.run_dir(trial_uuid).workdir
    shutil.rmtree(rig.home.run_dir(trial_uuid).artifacts)  # the run directory lost them
    for item in found["files"]:
        download = artifacts.open_artifact(rig.store, rig.home, trial_id, item["path"])
        data = b"".join(download.chunks())
        assert data == (workdir / item["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == item["sha256"]

    retention.delete_experiment(rig.store, None, rig.admin, experiment_id)
    assert worker.delete_experiment_now(experiment_id)
    assert list(backend.list(f"{uuid}/")) == []
    with rig.store.session_scope() as s:
        assert s.get(Experiment, experiment_id) is None
