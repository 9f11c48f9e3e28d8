"""The model registry through a real server (`/api/v1/models...`): a verified trial's
checkpoint registered as v1 and listed with its lineage; an unverified one refused with
what to do (409), a viewer refused at the door (403), a bad name or body a 4xx."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from muster.cli import app
from muster.client import Client
from tests.server.experiments import FIXTURES, only_trial, wait_trial
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server and real trials

server = shared_server()


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
