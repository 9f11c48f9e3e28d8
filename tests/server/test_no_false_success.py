"""No false success (invariant 1) through a real server: the API, the CLI and a server crash.

The training script is `tests/fixtures/harness_train.py` (a loop on `muster.harness`),
uploaded in a context directory together with its data, as a person would submit it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.processes import kill_home_processes
from tests.server.experiments import (
    FIXTURES,
    attempt_dir,
    only_trial,
    wait_ended,
    wait_trial,
)
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

MINUS = "\u2212"
CLASSES = ("0", "1", "2", "3")
PER_CLASS = 25  # 100 files in 4 class folders
SCRIPT = "harness_train.py"


server = shared_server()


def make_context(parent: Path, *args: str, data: bool = True,
                 verify: dict[str, Any] | None = None,
                 settings: dict[str, Any] | None = None) -> Path:
    """A context directory: the training script, `data/` (100 PNG files) and the config."""
    context = parent / "context"
    context.mkdir()
    shutil.copy2(FIXTURES / SCRIPT, context / SCRIPT)
    config: dict[str, Any] = {
        "name": "no-false-success",
        "entrypoint": ["python", SCRIPT, *args],
        "failure_policy": {"stop_grace": "1s"},
    }
    if data:
        for label in CLASSES:
            (context / "data" / label).mkdir(parents=True)
            for i in range(PER_CLASS):
                (context / "data" / label / f"{i:03d}.png").write_bytes(b"\x89PNG %d" % i)
        config["data"] = {"path": "data",
                          "manifest": {"extensions": [".png"], "labels": "from_dirs"}}
    if verify is not None:
        config["verify"] = verify
    config.update(settings or {})
    (context / "experiment.yaml").write_text(json.dumps(config, indent=2) + "\n")
    return context


def submit(client: Client, context: Path) -> tuple[int, int]:
    """(experiment id, trial id) of a new experiment made from `context`."""
    exp = client.create_experiment((context / "experiment.yaml").read_text(), context)
    return exp["id"], only_trial(exp)["id"]


def muster_cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m muster ARGS` against `server`, as a person would type it."""
    env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
           "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "muster", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def checks(trial: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in trial["verification"]["checks"]}


def file_reports(metrics_files: list[Path]) -> list[tuple[Any, ...]]:
    """(attempt, kind, step, time, metrics) of every line of the metrics files."""
    reports = []
    for path in metrics_files:
        attempt = int(path.parent.name.removeprefix("attempt-"))
        for line in path.read_text().splitlines():
            r = json.loads(line)
            reports.append((attempt, r["kind"], r["step"], r["time"], r["metrics"]))
    return sorted(reports, key=repr)


def api_reports(reports: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(((r["attempt"], r["kind"], r["step"], r["time"], r["metrics"])
                   for r in reports), key=repr)


# -- 1. the silent drop, reviewed through the CLI and the API ----------------------------


@pytest.mark.parametrize("decision", ["reject", "approve"])
def test_a_silent_drop_is_suspect_and_a_review_settles_it(
    server: RunningServer, client: Client, tmp_path: Path, decision: str
) -> None:
    experiment_id, trial_id = submit(
        client, make_context(tmp_path, "--epochs", "1", "--drop", "0.12"))

    trial = wait_trial(client, trial_id, {"SUSPECT", "SUCCEEDED", "FAILED", "CANCELED"})

    shortfall = f"epoch 1: 88 samples seen, 100 expected ({MINUS}12.0%)"
    assert trial["state"] == "SUSPECT", trial["message"]
    assert shortfall in trial["message"]
    assert trial["verification"]["passed"] is False
    assert checks(trial)["samples"] == {"name": "samples", "passed": False, "detail": shortfall,
                                     "status": "failed"}
    assert trial["manifest"]["file_count"] == 100
    assert trial["manifest"]["classes"] == {label: PER_CLASS for label in CLASSES}
    assert client.get_experiment(experiment_id)["state"] == "ACTIVE"
    assert client.wait_experiment(experiment_id, poll=0.05)["state"] == "ACTIVE"

    if decision == "reject":
        note = "the loader drops damaged files"
        done = muster_cli(server, "trial", "review", str(trial_id), "--reject",
                          "--note", note)
        assert done.returncode == 0, done.stderr
        assert f"trial {trial_id} rejected: FAILED" in done.stdout
        expected = ("FAILED", "ERROR")
    else:
        note = "12% is fine for this run"
        client.review_trial(trial_id, "approve", note)
        expected = ("SUCCEEDED", "COMPLETED")
    reviewed = client.get_trial(trial_id)
    assert reviewed["state"] == expected[0]
    last = reviewed["events"][-1]
    assert (last["from_state"], last["to_state"], last["actor"], last["message"]) == (
        "SUSPECT", expected[0], "admin", note)
    assert wait_ended(client, experiment_id)["state"] == expected[1]


# -- 4. a clean run ------------------------------------------------------------------------


def test_a_clean_run_succeeds_with_every_check_passed(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    # Both checkpoints are looked at below: checkpoint GC (by default the latest and the best
    # one are kept) would delete step 9 soon after the trial ended, at its own pace.
    context = make_context(tmp_path, "--epochs", "2", verify={
        "require_checkpoint": True, "require_metrics": ["loss", "val_loss"],
        "expected_length": {"epochs": 2}},
        settings={"checkpoint_storage": {"save_trial_latest": 2}})
    experiment_id, trial_id = submit(client, context)

    assert wait_ended(client, experiment_id)["state"] == "COMPLETED"
    trial = client.get_trial(trial_id)

    assert (trial["state"], trial["reason"]) == ("SUCCEEDED", "OK")
    assert trial["verification"]["passed"] is True
    assert {name: c["status"] for name, c in checks(trial).items()} == {
        "completed": "passed", "samples": "passed", "checkpoint": "passed",
        "checkpoint_fresh": "passed", "finite_metrics": "passed", "require_metrics": "passed",
        "log_errors": "passed", "log_complete": "passed", "metrics_readable": "passed"}
    assert trial["verification"]["verified"] is True
    assert checks(trial)["samples"]["detail"] == "2 epochs, each within 1.0% of 100"
    assert checks(trial)["metrics_readable"]["detail"] == "22 metric lines read"

    reports = client.all_metrics(trial_id)
    metrics_file = attempt_dir(server.home, trial, 1) / "rank-0.metrics.jsonl"
    assert api_reports(reports) == file_reports([metrics_file])
    assert [r["step"] for r in reports if r["kind"] == "training"] == list(range(20))
    assert [(r["step"], r["metrics"]) for r in reports if r["kind"] == "validation"] == [
        (9, {"val_loss": 0.2}), (19, {"val_loss": 0.1})]

    saved = client.list_checkpoints(trial_id)
    assert [(c["step"], c["attempt"], c["intact"], c["problem"]) for c in saved] == [
        (9, 1, True, None), (19, 1, True, None)]
    assert all(Path(c["path"]).is_dir() for c in saved)


# -- 7. the server killed while metrics stream in ----------------------------------------


@pytest.fixture
def restartable(server_home: Path) -> Iterator[RunningServer]:
    """A server of this test's own, to be SIGKILLed and started again."""
    running = RunningServer(home=server_home, db_url=f"sqlite:///{server_home / 'muster.db'}")
    running.start()
    try:
        yield running
    finally:
        running.stop()
        kill_home_processes(server_home)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.timeout(180)
def test_metrics_survive_a_server_sigkill_exactly_once(
    restartable: RunningServer, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    context = make_context(tmp_path, "--until", str(release), "--pause", "0.002",
                           "--samples", "1000", data=False)
    with restartable.client() as client:
        experiment_id, trial_id = submit(client, context)
        wait_until(lambda: len(client.get_metrics(trial_id, limit=100)) >= 50, timeout=60,
                   what="50 reports in the API", interval=0.05)
        trial = client.get_trial(trial_id)
    metrics_file = attempt_dir(restartable.home, trial, 1) / "rank-0.metrics.jsonl"

    restartable.kill()
    at_kill = _lines(metrics_file)
    wait_until(lambda: _lines(metrics_file) >= at_kill + 200, timeout=60,
               what="200 more lines written while the server is down")
    written_while_down = json.loads(metrics_file.read_text().splitlines()[-1])["step"]
    restartable.start()
    with restartable.client() as client:
        wait_until(lambda: client.get_metrics(trial_id, tail=1)[0]["step"] >= written_while_down,
                   timeout=60, what="the reports written while the server was down",
                   interval=0.05)
        release.touch()
        assert wait_ended(client, experiment_id)["state"] == "COMPLETED"
        trial = client.get_trial(trial_id)
        reports = client.all_metrics(trial_id)

    assert trial["state"] == "SUCCEEDED", trial["message"]
    assert len(trial["attempts"]) == 1  # the run went on through the crash; nothing re-ran
    written = file_reports(sorted(metrics_file.parent.parent.glob("attempt-*/rank-*.metrics"
                                                                  ".jsonl")))
    stored = api_reports(reports)
    assert len(stored) == len(written) > at_kill + 200
    assert stored == written
    assert len({(r[0], r[1], r[2]) for r in stored}) == len(stored)  # no duplicates
