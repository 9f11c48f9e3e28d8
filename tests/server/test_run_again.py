"""Run again (`context_from`): a new experiment from an earlier one's context snapshot,
through the API, the SDK and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from muster.errors import InvalidRequest, NotFound
from tests.cli.test_cli import muster
from tests.server.experiments import make_context, only_trial, submit, wait_ended
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server and real trials

server = shared_server()


def test_a_run_again_reuses_the_snapshot_with_a_new_config(server: RunningServer,
                                                           tmp_path: Path) -> None:
    context = make_context(tmp_path, "exit_with.sh", "0")
    with server.client() as client:
        first = wait_ended(client, submit(client, context)["id"])
        assert first["config_yaml"] == (context / "experiment.yaml").read_text()
        again = client.create_experiment(first["config_yaml"].replace('"test"', '"again"'),
                                         None, context_from=first["id"])
        ended = wait_ended(client, again["id"])
        assert (ended["name"], ended["state"]) == ("again", "COMPLETED")
        logs = client.read_logs(only_trial(ended)["id"]).data
    assert logs == client_logs(server, only_trial(first)["id"])
    snapshot = server.home / "experiments" / again["uuid"] / "context"
    assert sorted(p.name for p in snapshot.iterdir()) == ["exit_with.sh", "experiment.yaml"]


def client_logs(server: RunningServer, trial_id: int) -> bytes:
    with server.client() as client:
        return client.read_logs(trial_id).data


def test_run_again_of_nothing_or_with_an_upload_too_is_refused(server: RunningServer,
                                                               tmp_path: Path) -> None:
    config = (make_context(tmp_path, "exit0.sh") / "experiment.yaml").read_text()
    with server.client() as client:
        with pytest.raises(NotFound, match="experiment 999999 does not exist"):
            client.create_experiment(config, None, context_from=999_999)
        with pytest.raises(InvalidRequest, match="both `context` and `context_from`"):
            client.create_experiment(config, make_context(tmp_path, "exit0.sh"),
                                     context_from=1)
    bad = httpx.post(f"{server.url}/api/v1/experiments", timeout=30,
                     data={"config": config, "context_from": "-3"},
                     headers={"Authorization": f"Bearer {server.token}"})
    assert bad.status_code == 400 and "must be an experiment's id" in bad.json()["message"]


def test_the_cli_runs_again(server: RunningServer, tmp_path: Path) -> None:
    context = make_context(tmp_path, "exit0.sh")
    with server.client() as client:
        first = wait_ended(client, submit(client, context)["id"])
    done = muster(server.home, server.url, "experiment", "create",
                  str(context / "experiment.yaml"), "--context-from", str(first["id"]),
                  "--wait", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "COMPLETED"
