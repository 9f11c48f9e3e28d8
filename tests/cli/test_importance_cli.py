"""Hyperparameter importance through a real server: `GET /experiments/{id}/importance`, the
SDK, and `muster experiment importance ID [--json]` as a real subprocess give the numbers
Optuna gives for an equivalent study of its own. The rows are stored in the server's
database from the test (as in tests/services/test_importance.py)."""

from __future__ import annotations

import json

import pytest

from muster.client import Client
from muster.errors import Conflict
from tests.cli.test_cli import assert_clean_failure, on
from tests.server.test_search_api import raw
from tests.servers import RunningServer
from tests.services.test_importance import add_search, draw, loss, optuna_importances, shares

pytestmark = pytest.mark.lifecycle  # starts real processes


def store_search(server: RunningServer, trials: int) -> int:
    with server.store() as store, store.session_scope() as s:
        return add_search(s, trials).id


def test_the_cli_the_api_and_optuna_agree(server: RunningServer, client: Client) -> None:
    experiment_id = store_search(server, 40)
    done = on(server, "experiment", "importance", str(experiment_id), "--json")
    assert done.returncode == 0, done.stderr
    from_cli = json.loads(done.stdout)
    over_http = raw(server, f"/experiments/{experiment_id}/importance")
    assert over_http.status_code == 200
    assert from_cli == over_http.json() == client.experiment_importance(experiment_id)
    assert shares(from_cli) == optuna_importances([(draw(n), loss(draw(n)))
                                                   for n in range(40)])
    assert (from_cli["evaluator"], from_cli["ended_trials"], from_cli["trials_used"]) == (
        "PedAnovaImportanceEvaluator", 40, 40)
    assert from_cli["importances"][0]["name"] == "optimizer.lr"


def test_the_table_names_the_evaluator_and_the_trials(server: RunningServer) -> None:
    experiment_id = store_search(server, 30)
    done = on(server, "experiment", "importance", str(experiment_id))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        f"Experiment {experiment_id}: hyperparameter importance for val_loss (smaller is "
        "better)",
        "PedAnovaImportanceEvaluator over 30 trials with a value (30 ended)"]
    names = [line.split("│")[1].strip() for line in lines if line.startswith("│")]
    assert names[0] == "optimizer.lr"
    assert sorted(names) == ["model.act", "model.layers", "noise", "optimizer.lr"]
    assert " ".join(done.stdout.split()).endswith(
        "note: only 30 trials: the top 10% that PED-ANOVA compares with the rest holds 3 of "
        "them, where Optuna advises at least 5; read these shares as rough until more "
        "trials end")


def test_too_few_trials_is_a_409_and_one_line(server: RunningServer, client: Client) -> None:
    experiment_id = store_search(server, 5)
    stderr = assert_clean_failure(on(server, "experiment", "importance", str(experiment_id)))
    assert "has 5 SUCCEEDED trials with a finite 'val_loss'; hyperparameter importance needs " \
           "at least 10" in " ".join(stderr.split())
    response = raw(server, f"/experiments/{experiment_id}/importance")
    assert (response.status_code, response.json()["error"]) == (409, "Conflict")
    with pytest.raises(Conflict, match="ask again when more have ended"):
        client.experiment_importance(experiment_id)
    assert raw(server, "/experiments/999999/importance").status_code == 404
