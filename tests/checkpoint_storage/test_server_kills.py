"""A real server SIGKILLed while it uploads a checkpoint to S3 (moto) and while it deletes
checkpoints: after a restart the upload is redone and verified and the deletions finish;
at no moment does the store say `deleted` of a checkpoint storage still holds, and no S3
key or secret appears in the API's answers, the events or any log."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from muster.checkpoint_files import METADATA_FILE
from muster.checkpoint_storage.s3 import S3
from muster.checkpoint_storage.transfer import fetch_checkpoint
from muster.store import Checkpoint, Event
from tests.processes import kill_home_processes
from tests.server.experiments import make_context, only_trial, submit, wait_ended
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

ACCESS, SECRET = "AKIA-MUSTER-TEST-ACCESS-7731", "muster-test-secret-do-not-leak-9146"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    home = tmp_path / "home"
    home.mkdir()
    running = RunningServer(home=home, db_url=f"sqlite:///{home / 'muster.db'}",
                            env={"TEST_S3_KEY": ACCESS, "TEST_S3_SECRET": SECRET})
    running.start()
    try:
        yield running
    finally:
        running.stop()
        kill_home_processes(home)


def _submit(server: RunningServer, parent: Path, storage: dict[str, Any], values: str,
            *args: str) -> dict[str, Any]:
    context = make_context(parent, "checkpoint_series.py", values, *args)
    config = json.loads((context / "experiment.yaml").read_text())
    config.update(harness=True, checkpoint_storage=storage,
                  searcher={"name": "single", "metric": "val_loss"})
    (context / "experiment.yaml").write_text(json.dumps(config))
    with server.client() as client:
        return submit(client, context)


def _s3(endpoint: str, bucket: str) -> dict[str, Any]:
    return {"type": "s3", "bucket": bucket, "prefix": "kills", "endpoint_url": endpoint,
            "region": "us-east-1", "access_key": "env:TEST_S3_KEY",
            "secret_key": "env:TEST_S3_SECRET"}


def _states(server: RunningServer) -> dict[str, str]:
    with server.store() as store, store.session_scope() as s:
        return {u: st for u, st in s.execute(select(Checkpoint.uuid, Checkpoint.state))}


def _keys(client: Any, bucket: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix="kills/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_an_upload_cut_by_a_server_sigkill_is_redone_and_leaks_no_secret(
        server: RunningServer, tmp_path: Path, s3_endpoint: str, s3_bucket: str,
        s3_client: Any) -> None:
    exp = _submit(server, tmp_path, _s3(s3_endpoint, s3_bucket), "0.3",
                  "--size", str(160 << 20))
    uuid = wait_until(lambda: next((u for u, st in _states(server).items()
                                    if st == "uploading"), None),
                      timeout=60, what="the checkpoint's upload to begin", interval=0.02)
    server.kill()
    assert _states(server)[uuid] == "uploading"  # the store never ran ahead of storage
    server.start()
    wait_until(lambda: _states(server)[uuid] == "stored", timeout=120,
               what="the upload to be redone after the restart")
    backend = S3(s3_bucket, "kills", s3_endpoint, "us-east-1", "testing", "testing")
    fetched = fetch_checkpoint(backend, uuid, tmp_path / "fetched" / "step-1")
    with server.client() as client:
        trial = only_trial(wait_ended(client, exp["id"]))
        [row] = client.list_checkpoints(trial["id"])
    local = Path(row["path"]) / "model.bin"
    assert hashlib.sha256((fetched.path / "model.bin").read_bytes()).hexdigest() == (
        hashlib.sha256(local.read_bytes()).hexdigest())
    wait_until(lambda: not s3_client.list_multipart_uploads(
        Bucket=s3_bucket).get("Uploads"), timeout=60,
        what="the sweep to abort the killed server's multipart upload")
    assert f"kills/{uuid}/{METADATA_FILE}" in _keys(s3_client, s3_bucket)
    _assert_no_secret(server, exp["id"], trial["id"])


def _assert_no_secret(server: RunningServer, experiment_id: int, trial_id: int) -> None:
    with server.client() as client:
        answers = json.dumps([client.get_experiment(experiment_id),
                              client.list_checkpoints(trial_id),
                              client.list_experiment_checkpoints(experiment_id)])
    with server.store() as store, store.session_scope() as s:
        events = json.dumps(list(s.scalars(select(Event.message))))
    logs = "".join(p.read_text(errors="replace") for p in server.home.rglob("*")
                   if p.is_file() and (p.suffix in (".log", ".jsonl") or p.name == "log"))
    for text in (answers, events, logs):
        assert ACCESS not in text and SECRET not in text
    assert "env:TEST_S3_KEY" in answers  # where the key is read, never the key


def test_deletions_cut_by_a_server_sigkill_finish_and_never_run_ahead_of_storage(
        server: RunningServer, tmp_path: Path, s3_endpoint: str, s3_bucket: str,
        s3_client: Any) -> None:
    count = 120
    storage = {**_s3(s3_endpoint, s3_bucket), "save_trial_latest": count}
    exp = _submit(server, tmp_path, storage, ",".join(["0.5"] * count))
    with server.client() as client:
        trial = only_trial(wait_ended(client, exp["id"]))
        wait_until(lambda: all(r["state"] == "stored"
                               for r in client.list_checkpoints(trial["id"])),
                   timeout=120, what=f"{count} checkpoints to be stored")
        plan = client.collect_checkpoints(exp["id"], False, {"save_trial_latest": 1,
                                                             "save_trial_best": 0})
    assert sum(not c["keep"] for c in plan["checkpoints"]) == count - 1
    wait_until(lambda: len({k.split("/")[1] for k in _keys(s3_client, s3_bucket)}) <= count - 5,
               timeout=60, what="the first deletions from the bucket", interval=0.02)
    server.kill()
    states, keys = _states(server), _keys(s3_client, s3_bucket)
    assert "deleting" in states.values(), states  # killed in the middle of the collection
    for uuid, state in states.items():
        if state == "deleted":  # never said before storage confirmed it
            assert not any(k.startswith(f"kills/{uuid}/") for k in keys), uuid
    server.start()
    wait_until(lambda: list(_states(server).values()).count("deleted") == count - 1,
               timeout=120, what="the deletions to finish after the restart")
    [kept] = [u for u, st in _states(server).items() if st == "stored"]
    assert {k.split("/")[1] for k in _keys(s3_client, s3_bucket)} == {kept}
    with server.store() as store, store.session_scope() as s:
        events = s.scalars(select(Event.message).where(
            Event.reason == "checkpoint deleted")).all()
    assert len(events) == count - 1



