"""Checkpoint storage through the CLI of a real server: `checkpoint list` (the contract's
JSON), `checkpoint gc` (dry run, a changed policy re-applied), `checkpoint download ID DIR`
of a checkpoint only storage still holds, `experiment archive` and `experiment delete`.

The server's default storage is shared_fs in `$MUSTER_HOME/checkpoints` (latest 1, best 1).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from muster.checkpoint_files import METADATA_FILE
from muster.home import Home
from tests.cli.test_checkpoint_download import files_under, muster
from tests.server.experiments import make_context, only_trial, submit, wait_ended
from tests.servers import RunningServer
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]

CONTRACT = {"id", "uuid", "step", "state", "size", "storage_url", "metric", "metric_step"}
SETTLED = {"stored", "deleted"}


def _listed(server: RunningServer, trial_id: int, cwd: Path) -> list[dict[str, Any]]:
    done = muster(server, "checkpoint", "list", str(trial_id), "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _settled(server: RunningServer, trial_id: int, cwd: Path) -> list[dict[str, Any]]:
    return wait_until(  # type: ignore[no-any-return]
        lambda: (rows := _listed(server, trial_id, cwd)) and all(
            r["state"] in SETTLED for r in rows) and rows,
        timeout=60, what=f"trial {trial_id}'s checkpoints to be stored or deleted")


@pytest.fixture(scope="module")
def series(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A trial of 4 checkpoints (val_loss 0.5, 0.2, 0.4, 0.6), collected by the default
    policy: step 2 (best) and step 4 (latest) stay."""
    parent = tmp_path_factory.mktemp("series")
    context = make_context(parent, "checkpoint_series.py", "0.5,0.2,0.4,0.6")
    config = json.loads((context / "experiment.yaml").read_text())
    config.update(harness=True, searcher={"name": "single", "metric": "val_loss"})
    (context / "experiment.yaml").write_text(json.dumps(config))
    with server.client() as client:
        exp = submit(client, context)
        trial = only_trial(wait_ended(client, exp["id"]))
    assert trial["state"] == "SUCCEEDED", trial
    rows = _settled(server, trial["id"], parent)
    return {"experiment_id": exp["id"], "trial_id": trial["id"], "rows": rows}


def test_list_gives_the_contract_and_the_policy_kept_latest_and_best(
        server: RunningServer, series: dict[str, Any], tmp_path: Path) -> None:
    rows = series["rows"]
    assert all(set(row) >= CONTRACT for row in rows)
    assert [(r["step"], r["state"], r["metric"], r["metric_step"]) for r in rows] == [
        (1, "deleted", 0.5, 1), (2, "stored", 0.2, 2), (3, "deleted", 0.4, 3),
        (4, "stored", 0.6, 4)]
    storage = Home(server.home).checkpoints_dir
    for row in rows:
        if row["state"] == "stored":
            assert row["storage_url"] == f"{storage.as_uri()}/{row['uuid']}"
            assert (storage / row["uuid"] / METADATA_FILE).is_file()
            assert row["size"] > 0 and row["kept_because"]
        else:
            assert row["storage_url"] is None and not (storage / row["uuid"]).exists()
            assert row["deleted_because"].startswith("not among trial")
    table = muster(server, "checkpoint", "list", "--experiment",
                   str(series["experiment_id"]), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "stored" in table.stdout and "deleted" in table.stdout
    assert "Validated at" in table.stdout and "step 2" in table.stdout


def test_a_stored_checkpoint_the_run_directory_lost_downloads_from_storage(
        server: RunningServer, series: dict[str, Any], tmp_path: Path) -> None:
    kept = next(r for r in series["rows"] if r["step"] == 2)
    original = tmp_path / "original"
    shutil.copytree(kept["path"], original)
    shutil.rmtree(kept["path"])  # the run directory no longer holds it
    done = muster(server, "checkpoint", "download", kept["uuid"], "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert files_under(tmp_path / "out") == files_under(original)
    assert "each matching its sha256 in metadata.json" in done.stdout
    by_id = muster(server, "checkpoint", "download", str(kept["id"]), "again", cwd=tmp_path)
    assert by_id.returncode == 0, by_id.stderr
    model = (tmp_path / "again" / "model.bin").read_bytes()
    listed = json.loads((tmp_path / "again" / METADATA_FILE).read_text())["files"]
    assert listed["model.bin"] == hashlib.sha256(model).hexdigest()


def test_gc_dry_run_changes_nothing_and_a_new_policy_is_applied(
        server: RunningServer, series: dict[str, Any], tmp_path: Path) -> None:
    experiment = str(series["experiment_id"])
    dry = muster(server, "checkpoint", "gc", experiment, "--dry-run", "--save-trial-best",
                 "0", "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] and plan["policy"]["save_trial_best"] == 0
    assert [(c["step"], c["keep"]) for c in plan["checkpoints"]] == [(2, False), (4, True)]
    assert _listed(server, series["trial_id"], tmp_path)[1]["state"] == "stored"
    done = muster(server, "checkpoint", "gc", experiment, "--save-trial-best", "0",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 of 2 checkpoints are being deleted" in done.stdout
    wait_until(lambda: _listed(server, series["trial_id"], tmp_path)[1]["state"] == "deleted",
               timeout=30, what="step 2 to be deleted under the new policy")


def test_archive_hides_and_delete_removes_everything(
        server: RunningServer, tmp_path: Path) -> None:
    context = make_context(tmp_path, "checkpoint_series.py", "0.3")
    config = json.loads((context / "experiment.yaml").read_text())
    (context / "experiment.yaml").write_text(json.dumps({**config, "harness": True}))
    with server.client() as client:
        exp = submit(client, context)
        trial = only_trial(wait_ended(client, exp["id"]))
    [row] = _settled(server, trial["id"], tmp_path)
    ids = lambda *more: [e["id"] for e in json.loads(muster(  # noqa: E731
        server, "experiment", "list", "--json", *more, cwd=tmp_path).stdout)]
    assert muster(server, "experiment", "archive", str(exp["id"]), cwd=tmp_path).returncode == 0
    assert exp["id"] not in ids() and exp["id"] in ids("--archived")
    refused = muster(server, "experiment", "delete", str(exp["id"]), cwd=tmp_path)
    assert refused.returncode == 1 and "nothing was deleted" in refused.stdout
    done = muster(server, "experiment", "delete", str(exp["id"]), "--yes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "is being deleted" in done.stdout
    home = Home(server.home)
    with server.client() as client:
        wait_until(lambda: not _exists(client, exp["id"]), timeout=30,
                   what=f"experiment {exp['id']} to be deleted")
    assert not (home.checkpoints_dir / row["uuid"]).exists()
    assert not home.run_dir(trial["uuid"]).path.exists()
    gone = muster(server, "checkpoint", "list", str(trial["id"]), cwd=tmp_path)
    assert gone.returncode != 0 and "does not exist" in gone.stderr


def _exists(client: Any, experiment_id: int) -> bool:
    from muster.errors import NotFound

    try:
        client.get_experiment(experiment_id)
    except NotFound:
        return False
    return True
