"""The model registry through a real server (`/api/v1/models...`): a verified trial's
checkpoint registered as v1 and listed with its lineage; an unverified one refused with
what to do (409), a viewer refused at the door (403), a bad name or body a 4xx; stages,
downloads checked file by file, deletes in order, and the cluster config that lets an owner
accept its own unverified trial."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
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
from tests.server.experiments import FIXTURES, only_trial, wait_trial
from tests.servers import RunningServer, serving

pytestmark = pytest.mark.lifecycle  # a real server and real trials


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; its cluster config lets owners accept their own
    unverified trials."""
    top = tmp_path_factory.mktemp("server")
    cluster = top / "cluster.yaml"
    cluster.write_text("registry: {owners_accept_unverified: true}\n")
    with serving(top / "home", options=["--min-free-disk", "0", "--cluster-config",
                                        str(cluster)]) as running:
        yield running


def _cli(server: RunningServer, *argv: str) -> Any:
    return CliRunner().invoke(app, ["model", *argv, "--url", server.url,
                                    "--home", str(server.home)])


def _api(server: RunningServer, method: str, path: str, token: str | None = None,
         **body: Any) -> httpx.Response:
    return httpx.request(method, f"{server.url}/api/v1{path}", json=body or None, timeout=30,
                         headers={"Authorization": f"Bearer {token or server.token}"})


def _trial(client: Client, tmp_path: Path, **verify: Any) -> int:
    context = tmp_path / "context"
    context.mkdir(parents=True)
    shutil.copy2(FIXTURES / "search_job.py", context / "search_job.py")
    config = {"name": "registry", "entrypoint": ["python", "search_job.py"], "harness": True,
              "hyperparameters": {"x": 0.5}, "verify": verify,
              "searcher": {"name": "single", "metric": "loss", "max_length": 3}}
    trial = only_trial(client.create_experiment(json.dumps(config), context))
    return int(wait_trial(client, trial["id"], {"SUCCEEDED", "SUSPECT"}, timeout=90)["id"])


def test_a_verified_trial_becomes_v1_and_an_unverified_one_says_what_it_takes(
        server: RunningServer, client: Client, tmp_path: Path) -> None:
    verified = _trial(client, tmp_path / "a")
    suspect = _trial(client, tmp_path / "b", expected_length={"steps": 10})

    made = _api(server, "POST", "/models", name="digits", labels=["demo"])
    assert made.status_code == 201, made.text
    v1 = _api(server, "POST", "/models/digits/versions", trial_id=verified)
    assert v1.status_code == 201, v1.text
    assert (v1.json()["version"], v1.json()["verified"]) == (1, True)
    refused = _api(server, "POST", "/models/digits/versions", trial_id=suspect)
    assert refused.status_code == 409 and "--accept-unverified" in refused.text
    accepted = _api(server, "POST", "/models/digits/versions", trial_id=suspect,
                    accept_unverified="a baseline to beat")
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["accepted_unverified"]["reason"] == "a baseline to beat"

    listed = _api(server, "GET", "/models").json()
    assert [(m["name"], [v["version"] for v in m["versions"]]) for m in listed] == [
        ("digits", [1, 2])]
    versions = _api(server, "GET", "/models/digits/versions").json()
    assert versions[0]["lineage"]["trial_id"] == verified
    assert versions[1]["verified"] is False

    assert _api(server, "GET", "/models/nope").status_code == 404
    assert _api(server, "POST", "/models", name="bad name").status_code == 422
    assert _api(server, "POST", "/models", name="digits").status_code == 409
    assert _api(server, "POST", "/models/digits/versions", trial_id=verified,
                pick="worst").status_code == 422
    described = CliRunner().invoke(app, ["model", "describe", "digits", "--json", "--url",
                                         server.url, "--home", str(server.home)])
    assert described.exit_code == 0, described.output
    shown = json.loads(described.output)
    assert {"name", "description", "labels", "versions"} <= set(shown)
    assert {"version", "stage", "trial_id", "experiment_id", "checkpoint_uuid", "verified",
            "accepted_unverified", "metrics", "snapshot", "registered_by",
            "registered_at"} <= set(shown["versions"][0])
    registered = CliRunner().invoke(app, ["model", "register", "digits", "--trial",
                                          str(verified), "--best", "--url", server.url,
                                          "--home", str(server.home)])
    assert registered.exit_code == 0, registered.output
    assert registered.output.startswith(f"v3 (none): trial {verified}, checkpoint ")
    assert "verified; registered by admin" in registered.output

    with server.client() as admin:
        vera = admin.create_user("vera", "viewer")["token"]
    assert _api(server, "POST", "/models", vera, name="veras").status_code == 403
    assert _api(server, "GET", "/models", vera).status_code == 200


def test_stages_downloads_and_deletes(server: RunningServer, client: Client,
                                      tmp_path: Path) -> None:
    trial_id = _trial(client, tmp_path / "t")
    assert _api(server, "POST", "/models", name="staged").status_code == 201
    for _ in range(2):
        assert _api(server, "POST", "/models/staged/versions",
                    trial_id=trial_id).status_code == 201

    staged = _cli(server, "stage", "staged@1", "production")
    assert staged.exit_code == 0, staged.output
    assert staged.output.startswith("v1 (production): ")
    moved = _api(server, "PUT", "/models/staged/versions/v2/stage", stage="production")
    assert moved.status_code == 200 and moved.json()["stage"] == "production"
    assert [v["stage"] for v in _api(server, "GET", "/models/staged/versions").json()] == [
        "archived", "production"]
    assert _api(server, "GET", "/models/staged/versions/production").json()["version"] == 2
    assert _api(server, "GET", "/models/staged/versions/staging").status_code == 404
    assert _api(server, "GET", "/models/staged/versions/best").status_code == 422
    assert _api(server, "PUT", "/models/staged/versions/1/stage",
                stage="shipped").status_code == 422

    # The download: a tar.gz of the checkpoint under `staged-v2/`, byte for byte.
    version = client.get_model_version("staged@production")
    source = Path(client.get_checkpoint(version["checkpoint_uuid"])["path"])
    raw = httpx.get(f"{server.url}/api/v1/models/staged/versions/2/download", timeout=30,
                    headers={"Authorization": f"Bearer {server.token}"})
    assert raw.status_code == 200 and raw.headers["content-type"] == "application/gzip"
    assert 'filename="staged-v2.tar.gz"' in raw.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(raw.content))) as tar:
        names = tar.getnames()
    assert names[0] == "staged-v2/metadata.json"
    downloaded = _cli(server, "download", "staged@production", str(tmp_path / "model"))
    assert downloaded.exit_code == 0, downloaded.output
    assert "staged v2 → " in downloaded.output and "every sha256 checked" in downloaded.output
    theirs = {p.relative_to(source): p.read_bytes() for p in source.rglob("*") if p.is_file()}
    ours = {p.relative_to(tmp_path / "model"): p.read_bytes()
            for p in (tmp_path / "model").rglob("*") if p.is_file()}
    assert ours == theirs and len(ours) >= 2

    # A file changed after registration (its size kept) cuts the download off: nothing kept.
    tampered = next(p for p in source.rglob("*") if p.is_file() and p.name != "metadata.json")
    original = tampered.read_bytes()
    tampered.write_bytes(bytes([original[0] ^ 0xFF]) + original[1:])
    try:
        with pytest.raises(errors.ServerError, match="broke off"):
            client.download_model_version("staged@2", tmp_path / "broken")
        assert not (tmp_path / "broken").exists()
    finally:
        tampered.write_bytes(original)

    # Deletes: an admin's; versions first, then the model; each an event with its actor.
    with server.client() as admin:
        alice = admin.create_user("alice-del", "user")["token"]
    assert _api(server, "DELETE", "/models/staged/versions/1", alice).status_code == 403
    refused = _cli(server, "delete", "staged", "--yes")
    assert refused.exit_code != 0 and "staged@1, staged@2" in str(refused.exception)
    for ref in ("staged@1", "staged@2", "staged"):
        gone = _cli(server, "delete", ref, "--yes")
        assert gone.exit_code == 0, gone.output
    assert _api(server, "GET", "/models/staged").status_code == 404
    said = [e["message"] for e in client.list_events(tail=100)
            if e["entity"] == "model" and "staged" in (e["message"] or "")]
    assert "staged v2: none → production; v1 was production and is archived" in said
    assert any(m.startswith("staged v1 deleted (checkpoint ") for m in said)
    assert "model staged deleted" in said


def test_an_owner_accepts_its_own_unverified_trial_where_the_cluster_allows(
        server: RunningServer, tmp_path: Path) -> None:
    with server.client() as admin:
        token = admin.create_user("olga", "user")["token"]
    with Client(url=server.url, token=token, home=Home(server.home)) as olga:
        suspect = _trial(olga, tmp_path, expected_length={"steps": 10})
        olga.create_model("olgas")
        with pytest.raises(errors.Conflict, match="unless an admin or the trial's owner"):
            olga.register_model_version("olgas", suspect)
        marked = olga.register_model_version("olgas", suspect,
                                             accept_unverified="a baseline to beat")
    assert marked["accepted_unverified"] is not None
    assert (marked["verified"], marked["accepted_unverified"]["by"]) == (False, "olga")
    listed = _cli(server, "versions", "olgas")
    assert "UNVERIFIED, accepted by olga: a baseline to beat" in listed.output

    # The server exports only to the MLflow its cluster config names: none here.
    asked = _api(server, "POST", "/models/olgas/versions/1/mlflow", token)
    assert asked.status_code == 409 and "names no MLflow tracking server" in asked.text
    with server.client() as admin:
        viewer = admin.create_user("vic", "viewer")["token"]
    assert _api(server, "POST", "/models/olgas/versions/1/mlflow", viewer).status_code == 403
