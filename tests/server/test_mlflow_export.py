"""Model versions handed to a real MLflow tracking server (`mlflow server` from .venv-mlflow,
SQLite backend, its artifacts proxied, on a loopback port; one for the module): `muster
model export NAME@V --mlflow URL` as the user makes the run (params, metric series, tags,
the checkpoint and artifacts byte-identical) and a registered version linked to it, as MLflow's
own API and its UI's API show them; a server whose cluster config says `mlflow: {export:
on_register}` exports each new version itself and says so in an event; one whose MLflow does
not answer records the failure and keeps the version.

Without .venv-mlflow (`make install` makes it) the tests that need MLflow skip with that
reason, unless MUSTER_REQUIRE_MLFLOW=1 (CI), which makes the skip a failure."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from muster.cli import app
from muster.client import Client
from muster.errors import ExportError, ServerError
from tests.processes import kill_home_processes
from tests.server.experiments import only_trial, wait_trial
from tests.servers import RunningServer, serving
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = ROOT / ".venv-mlflow" / "bin" / "mlflow"

SCRIPT = """\
import os
from pathlib import Path

import muster.harness as mh

with mh.init() as ctx:
    hp = ctx.hparams
    length = ctx.max_length or 3
    for step in range(1, length + 1):
        ctx.report_training(step, {"loss": hp["lr"] * 100 / step})
        ctx.report_validation(step, {"val_loss": 2.0 / step, "accuracy": step / 10})
    with ctx.checkpoint.save(length) as path:
        (path / "state.txt").write_text(f"step {length}")
        (path / "weights.bin").write_bytes(os.urandom(50_000))
    Path("eval").mkdir(exist_ok=True)
    Path("eval/report.json").write_text('{"accuracy": 0.3}')
    Path("model.pt").write_bytes(os.urandom(20_000))
"""
HPARAMS = {"lr": 0.01, "optimizer": {"name": "adam", "beta": 0.9}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"mlflow server exited: {log.read_text()[-4000:]}")
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server for the module: its URL."""
    if not MLFLOW.exists():
        reason = f"no {MLFLOW.relative_to(ROOT)}: `make install` installs MLflow's server there"
        if os.environ.get("MUSTER_REQUIRE_MLFLOW") == "1":
            pytest.fail(f"{reason} (and MUSTER_REQUIRE_MLFLOW=1 requires the MLflow tests)")
        pytest.skip(reason)
    top = tmp_path_factory.mktemp("mlflow")
    url = f"http://127.0.0.1:{_free_port()}"
    log = top / "mlflow.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{top / 'mlflow.db'}",
             "--artifacts-destination", str(top / "artifacts"), "--host", "127.0.0.1",
             "--port", url.rsplit(":", 1)[1], "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, cwd=top, start_new_session=True,
            # its background job runner (GenAI evaluations) is not what muster talks to
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        wait_until(lambda: _answers(url, proc, log), timeout=120, interval=0.2,
                   what="the MLflow server to answer /health")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, mlflow_url: str
           ) -> Iterator[RunningServer]:
    """A muster server that exports every newly registered version to `mlflow_url`, each
    registered there with the prefix `onreg-`."""
    top = tmp_path_factory.mktemp("muster")
    config = top / "cluster.yaml"
    config.write_text(json.dumps({"mlflow": {"tracking_uri": mlflow_url,
                                             "export": "on_register",
                                             "registered_model_prefix": "onreg-"}}))
    with serving(top / "home", options=["--min-free-disk", "0", "--cluster-config",
                                        str(config)]) as running:
        yield running


def _verified_version(client: Client, tmp_path: Path, model: str) -> dict[str, Any]:
    """A verified trial of SCRIPT registered as `model`'s v1."""
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(SCRIPT)
    config = {"name": "mlflow-export", "entrypoint": ["python", "train.py"], "harness": True,
              "hyperparameters": HPARAMS, "artifacts": ["model.pt", "eval/*.json"],
              "searcher": {"name": "single", "metric": "val_loss", "max_length": 3}}
    trial = only_trial(client.create_experiment(json.dumps(config), context))
    ended = wait_trial(client, trial["id"], {"SUCCEEDED", "SUSPECT", "FAILED"}, timeout=90)
    assert (ended["state"], ended["verified"]) == ("SUCCEEDED", True), ended
    client.create_model(model)
    return dict(client.register_model_version(model, trial["id"]))


def _mlflow(url: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=url, registry_uri=url)


def _files(top: Path) -> dict[str, bytes]:
    return {p.relative_to(top).as_posix(): p.read_bytes()
            for p in sorted(top.rglob("*")) if p.is_file()}


def _cli(server: RunningServer, *args: str) -> Any:
    return CliRunner().invoke(app, ["model", *args, "--url", server.url,
                                    "--home", str(server.home)])


def test_the_cli_exports_a_version_as_an_mlflow_run_and_a_registered_version(
        server: RunningServer, client: Client, mlflow_url: str, tmp_path: Path) -> None:
    version = _verified_version(client, tmp_path, "digits")
    exported = _cli(server, "export", "digits@1", "--mlflow", mlflow_url,
                    "--registered-model", "cli-digits", "--json")
    assert exported.exit_code == 0, exported.output
    made = json.loads(exported.stdout)
    assert (made["model"], made["version"], made["registered_model"]) == (
        "digits", 1, "cli-digits")

    mlflow = _mlflow(mlflow_url)
    run = mlflow.get_run(made["run_id"])
    assert run.info.status == "FINISHED"
    assert mlflow.get_experiment(run.info.experiment_id).name == "mlflow-export"
    assert run.data.params == {"lr": "0.01", "optimizer.beta": "0.9",
                               "optimizer.name": "adam"}
    reports = [r for r in client.all_metrics(version["trial_id"]) if r["rank"] == 0]
    for kind, name in (("training", "loss"), ("validation", "val_loss"),
                       ("validation", "accuracy")):
        history = mlflow.get_metric_history(made["run_id"], f"{kind}/{name}")
        assert sorted((m.step, m.value) for m in history) == sorted(
            (r["step"], r["metrics"][name]) for r in reports if r["kind"] == kind)
    tags = run.data.tags
    assert {key: tags[key] for key in ("muster.model", "muster.model_version",
                                       "muster.trial_id", "muster.experiment_id",
                                       "muster.checkpoint_uuid", "muster.owner",
                                       "muster.verified", "mlflow.user")} == {
        "muster.model": "digits", "muster.model_version": "1",
        "muster.trial_id": str(version["trial_id"]),
        "muster.experiment_id": str(version["experiment_id"]),
        "muster.checkpoint_uuid": version["checkpoint_uuid"], "muster.owner": "admin",
        "muster.verified": "true", "mlflow.user": "admin"}
    assert tags["muster.snapshot.code"] == version["snapshot"]["code"]
    assert tags["muster.snapshot.config_sha256"] == version["snapshot"]["config_sha256"]
    assert tags["muster.check.completed"].startswith("passed: ")
    assert "muster.accepted_unverified.reason" not in tags

    client.download_checkpoint_by_ref(version["checkpoint_uuid"], tmp_path / "muster-ckpt")
    client.download_artifacts(version["trial_id"], tmp_path / "muster-artifacts")
    got = Path(mlflow.download_artifacts(made["run_id"], "", str(tmp_path / "from-mlflow")))
    assert _files(got / "checkpoint") == _files(tmp_path / "muster-ckpt")
    assert set(_files(got / "checkpoint")) == {"metadata.json", "state.txt", "weights.bin"}
    assert _files(got / "artifacts") == _files(tmp_path / "muster-artifacts")
    assert set(_files(got / "artifacts")) == {"eval/report.json", "model.pt"}

    registered = mlflow.get_model_version("cli-digits", str(made["model_version"]))
    assert registered.run_id == made["run_id"]
    assert registered.source == f"runs:/{made['run_id']}/checkpoint"
    assert registered.tags["muster.verified"] == "true"

    # What the MLflow UI's run page asks its server for shows the tags.
    page = httpx.get(f"{mlflow_url}/ajax-api/2.0/mlflow/runs/get",
                     params={"run_id": made["run_id"]}, timeout=30)
    assert page.status_code == 200, page.text
    shown = {t["key"]: t["value"] for t in page.json()["run"]["data"]["tags"]}
    assert (shown["muster.verified"], shown["muster.model"]) == ("true", "digits")
    assert shown["mlflow.note.content"].startswith("muster model digits v1: checkpoint ")

    again = _cli(server, "export", "digits", "--mlflow", mlflow_url)  # the latest, by name
    assert again.exit_code == 0, again.output
    assert "digits v1 → MLflow at " in again.output
    assert "registered model digits version 1" in again.output
    assert f"  run:     {mlflow_url}/#/experiments/{run.info.experiment_id}/runs/" in \
        again.output


def _events(client: Client, trial_id: int, kind: str) -> list[dict[str, Any]]:
    return [dict(e) for e in client.list_events(trial_id=trial_id) if e["kind"] == kind]


def test_on_register_the_server_exports_each_new_version_and_records_it(
        server: RunningServer, client: Client, mlflow_url: str, tmp_path: Path) -> None:
    version = _verified_version(client, tmp_path, "onreg")

    [event] = wait_until(lambda: _events(client, version["trial_id"], "model exported"),
                         timeout=120, what="the model exported event")
    assert event["actor"] == "admin"
    mlflow = _mlflow(mlflow_url)
    [registered] = mlflow.search_model_versions("name = 'onreg-onreg'")
    assert registered.run_id in event["message"]
    run = mlflow.get_run(registered.run_id)
    assert (run.data.tags["muster.model"], run.data.tags["muster.verified"]) == (
        "onreg", "true")
    assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "training/loss")] == [
        1, 2, 3]

    # Asked for again (say after a failure): the server's MLflow, through its API and CLI.
    asked = client.export_model_version("onreg@1")
    assert (asked["registered_model"], asked["model_version"]) == ("onreg-onreg", 2)
    assert asked["run_id"] != registered.run_id
    said = _cli(server, "export", "onreg@1", "--json")
    assert said.exit_code == 0, said.output
    assert json.loads(said.stdout)["model_version"] == 3
    assert len(_events(client, version["trial_id"], "model exported")) == 3


def test_an_mlflow_that_does_not_answer_fails_the_export_not_the_registration(
        tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    config = tmp_path / "cluster.yaml"
    config.write_text(json.dumps({"mlflow": {"tracking_uri": dead, "export": "on_register"}}))
    home = tmp_path / "home"
    with serving(home, options=["--min-free-disk", "0", "--cluster-config", str(config)]
                 ) as running, running.client() as client:
        version = _verified_version(client, tmp_path, "lost")
        assert version["version"] == 1  # registered: the export is not its business

        [event] = wait_until(lambda: _events(client, version["trial_id"],
                                             "model export failed"),
                             timeout=60, what="the model export failed event")
        assert event["actor"] == "admin"
        assert f"lost v1 was not exported to MLflow at {dead}: no MLflow tracking server " \
               f"answers at {dead}" in event["message"]
        assert [v["version"] for v in client.get_model("lost")["versions"]] == [1]

        with pytest.raises(ServerError, match="no MLflow tracking server answers"):
            client.export_model_version("lost@1")
        refused = CliRunner().invoke(app, ["model", "export", "lost@1", "--mlflow", dead,
                                           "--url", running.url, "--home", str(home)])
        assert refused.exit_code != 0
        assert isinstance(refused.exception, ExportError)
        assert f"no MLflow tracking server answers at {dead}" in str(refused.exception)
    kill_home_processes(home)
