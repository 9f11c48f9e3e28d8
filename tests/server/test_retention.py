"""Retention on a real server (`muster up --cluster-config` with `retention: {logs_after: 1s,
runs_after: 2s, keep_labels: [keep]}`): real trials that saved checkpoints and artifacts, a
registered model version, a labelled experiment and a trial still running; `muster gc runs
--dry-run` prints the plan with sizes and removes nothing; `muster gc runs` has the storage
worker remove the old run (run directory, logs, checkpoints in storage and on disk,
artifacts), each removal an event recorded before it, while the registered version's
checkpoint still downloads intact, its trial only loses its logs, and the labelled
experiment and the live trial are untouched. The readers then answer 410 with when and
why."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from muster import errors
from muster.cli import app
from muster.client import Client
from muster.home import Home
from muster.rundir import RankFile
from tests.server.experiments import only_trial, wait_trial
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

# Two checkpoints and an artifact: every kind of file retention removes.
SCRIPT = (Path(__file__).resolve().parents[1] / "fixtures" / "checkpointed_run.py").read_text()
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"
RETENTION = {"logs_after": "1s", "runs_after": "2s", "keep_labels": ["keep"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    top = tmp_path_factory.mktemp("retention")
    config = top / "cluster.yaml"
    config.write_text(json.dumps({"retention": RETENTION}))
    with serving(top / "home", options=["--min-free-disk", "0", "--cluster-config",
                                        str(config)]) as running:
        yield running


def _submit(client: Client, tmp_path: Path, name: str, script: str, **extra: Any
            ) -> dict[str, Any]:
    context = tmp_path / name
    context.mkdir()
    (context / "train.py").write_text(script)
    config = {"name": name, "entrypoint": ["python", "train.py"], "harness": True,
              "searcher": {"name": "single", "metric": "val_loss", "max_length": 2},
              "artifacts": ["model.pt"], "failure_policy": {"stop_grace": 1.0}, **extra}
    return only_trial(client.create_experiment(json.dumps(config), context))


def _cli(server: RunningServer, *args: str) -> Any:
    return CliRunner().invoke(app, ["gc", "runs", *args, "--url", server.url,
                                    "--home", str(server.home)])


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and not p.is_symlink()}


def _stored(client: Client, trial_id: int) -> bool:
    """Its checkpoints settled in storage (GC done) and its artifacts stored."""
    states = {c["state"] for c in client.list_checkpoints(trial_id)}
    return states <= {"stored", "deleted"} and "stored" in states and (
        client.get_artifacts(trial_id)["storage_state"] == "stored")


def test_a_sweep_removes_old_runs_but_not_a_registered_checkpoint_nor_a_live_trial(
        server: RunningServer, tmp_path: Path) -> None:
    client = Client(server.url, token=server.token, home=Home(server.home))
    home = Home(server.home)
    old = _submit(client, tmp_path, "old", SCRIPT)
    held = _submit(client, tmp_path, "held", SCRIPT)
    labelled = _submit(client, tmp_path, "labelled", SCRIPT, labels=["keep"])
    live = _submit(client, tmp_path, "live", SLEEPER, harness=False)
    for trial in (old, held, labelled):
        ended = wait_trial(client, trial["id"], {"SUCCEEDED", "SUSPECT", "FAILED"}, timeout=120)
        assert (ended["state"], ended["verified"]) == ("SUCCEEDED", True), ended
    wait_trial(client, live["id"], {"RUNNING"}, timeout=60)
    client.create_model("kept")
    version = client.register_model_version("kept", held["id"])
    wait_until(lambda: all(_stored(client, t["id"]) for t in (old, held, labelled)),
               timeout=60, what="checkpoints and artifacts in storage")
    runs = {t["id"]: home.run_dir(t["uuid"]).path for t in (old, held, labelled, live)}
    live_log = home.run_dir(live["uuid"]).attempt(1).rank(0).log
    before = {t: _tree(runs[t]) for t in runs}
    old_checkpoints = [c["uuid"] for c in client.list_checkpoints(old["id"])
                       if c["state"] == "stored"]
    assert all((home.checkpoints_dir / u).is_dir() for u in old_checkpoints)

    # The plan, once the experiments are old enough (2 s): sizes, and nothing removed.
    def past_runs_after() -> Any:
        p = client.sweep_runs(dry_run=True)
        return ((old["id"], "run") in {(x["trial_id"], x["what"]) for x in p["lines"]}
                and held["id"] in {k["trial_id"] for k in p["kept"]} and p)

    plan = wait_until(past_runs_after, timeout=60, what="the experiments to be past runs_after")
    assert (plan["enabled"], plan["rules"]) == (True, {
        "logs_after": "1s", "runs_after": "2s", "keep_registered": True, "keep_labels": ["keep"]})
    lines = {(line["trial_id"], line["what"], line["name"]): line for line in plan["lines"]}
    assert set(lines) == {(old["id"], "run", None), (old["id"], "artifacts", "attempt 1"),
                          (held["id"], "logs", None),
                          *((old["id"], "checkpoint", c["name"])
                            for c in client.list_checkpoints(old["id"])
                            if c["state"] == "stored")}
    assert lines[(old["id"], "artifacts", "attempt 1")]["bytes"] == 10_000
    assert all(line["bytes"] > 0 for line in plan["lines"])
    assert plan["total_bytes"] == sum(line["bytes"] for line in plan["lines"])
    kept = {(k["experiment_id"], k["trial_id"]): k["why"] for k in plan["kept"]}
    assert kept[(labelled["experiment_id"], None)] == "labelled 'keep' (retention.keep_labels)"
    assert "registered as kept v1" in kept[(held["experiment_id"], held["id"])]
    dry = _cli(server, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: nothing is removed" in dry.output and "nothing was removed" in dry.output
    assert "runs_after 2s" in dry.output and "logs_after 1s" in dry.output
    assert "total" in dry.output and "registered as kept v1" in dry.output
    assert {t: _tree(runs[t]) for t in (old["id"], held["id"], labelled["id"])} == {
        t: before[t] for t in (old["id"], held["id"], labelled["id"])}

    # The sweep: the old run goes, each removal recorded first.
    done = _cli(server)
    assert done.exit_code == 0, done.output
    assert "the storage worker removes these now" in done.output
    wait_until(lambda: not runs[old["id"]].exists()
               and not any((home.checkpoints_dir / u).exists() for u in old_checkpoints)
               and client.get_artifacts(old["id"])["storage_state"] == "deleted"
               and not home.run_dir(held["uuid"]).attempt(1).ranks_with(RankFile.LOG),
               timeout=60, what="the storage worker to remove the old run and logs")
    assert {c["state"] for c in client.list_checkpoints(old["id"])} == {"deleted"}
    events = client.list_events(trial_id=old["id"])
    [removed] = [e for e in events if e["kind"] == "run files removed"]
    assert removed["actor"] == "system:storage"
    assert f"the run directory of trial {old['id']} (" in (removed["message"] or "")
    assert "past retention.runs_after 2s; asked for by admin" in (removed["message"] or "")
    by_retention = [e for e in events if e["kind"] == "checkpoint deleted"
                    and "retention: " in (e["message"] or "")]
    assert len(by_retention) == len(old_checkpoints)
    assert all(e["id"] > removed["id"] for e in by_retention)  # recorded, then done
    [logs_removed] = [e for e in client.list_events(trial_id=held["id"])
                      if e["kind"] == "logs removed"]
    assert "past retention.logs_after 1s" in (logs_removed["message"] or "")

    # What stays: the registered checkpoint (downloaded, every sha256 checked), the held
    # trial's run less its logs, the labelled experiment and the live trial whole.
    _, found = client.download_model_version("kept@1", tmp_path / "kept")
    assert found.intact and "weights.bin" in found.file_sizes
    assert version["checkpoint_uuid"] in {c["uuid"] for c in client.list_checkpoints(held["id"])
                                          if c["state"] == "stored"}
    assert (runs[held["id"]] / "workdir" / "model.pt").is_file()
    assert _tree(runs[labelled["id"]]) == before[labelled["id"]]
    assert live_log.read_bytes() == b"up\n"
    assert set(before[live["id"]]) <= set(_tree(runs[live["id"]]))
    assert client.get_trial(live["id"])["state"] == "RUNNING"

    # The readers say what happened, and when.
    with pytest.raises(errors.Gone, match=f"trial {old['id']}'s run directory .*removed by "
                                          r"retention on .*retention\.runs_after"):
        client.read_logs(old["id"])
    with pytest.raises(errors.Gone, match=f"trial {held['id']}'s logs were removed"):
        client.read_logs(held["id"])
    with pytest.raises(errors.Gone, match=r"retention\.runs_after"):
        client.download_artifacts(old["id"], tmp_path / "artifacts")
    page = httpx.get(f"{server.url}/trials/{held['id']}", timeout=30,
                     headers={"Authorization": f"Bearer {server.token}"})
    assert page.status_code == 200 and 'id="log-removed"' in page.text
    assert f"trial {held['id']}&#39;s logs were removed by retention" in page.text
    assert client.read_logs(labelled["id"]).data  # a kept one reads as ever

    after = client.sweep_runs(dry_run=True)
    assert (after["lines"], after["total_bytes"]) == ([], 0)
    assert after["message"] == "nothing is past the retention rules"


def test_a_misspelt_dry_run_is_refused_and_removes_nothing(server: RunningServer) -> None:
    refused = httpx.post(f"{server.url}/api/v1/retention/runs", json={"dryrun": True},
                         headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
    assert refused.status_code == 422, refused.text
    assert "dryrun" in refused.text
