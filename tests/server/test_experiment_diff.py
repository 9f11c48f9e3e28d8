"""Snapshots through a real server: the trial part in `GET /trials/{id}`, in each trial of
`GET /experiments/{id}` and in `/best`, and `GET /experiments/{id}/diff/{other_id}`, which
compares two experiments through one trial each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.server.test_search_api import raw, store_search
from tests.server.test_search_views import add_experiment, search_config
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # a real server

server = shared_server()

TRAIN = "print('training')\n"


def submit(client: Client, context: Path, **config: Any) -> dict[str, Any]:
    """An experiment of `context` (which holds train.py alone: the config is sent apart, so
    two experiments differ only where their configs do)."""
    if not context.exists():
        context.mkdir()
        (context / "train.py").write_text(TRAIN)
    text = json.dumps({"name": "snap", "entrypoint": ["true"], **config})
    return client.create_experiment(text, context)


def test_a_trial_s_describe_carries_its_snapshot(server: RunningServer, client: Client,
                                                 tmp_path: Path) -> None:
    exp = submit(client, tmp_path / "ctx", hyperparameters={"lr": 0.01, "model": {"d": 64}},
                 reproducibility={"experiment_seed": 7})
    trial_id = exp["trials"][0]["id"]
    part = client.get_trial(trial_id)["snapshot"]
    assert part == raw(server, f"/trials/{trial_id}/snapshot").json()["trial"]
    assert part["hparams"] == {"lr": 0.01, "model": {"d": 64}}
    assert len(part["code"]["tree_sha256"]) == 64 and part["code"]["files"] == 1
    assert isinstance(part["seed"], int)
    # No environment: the packages of the interpreter the trial runs on (the server's).
    assert part["environment"]["key"] is None
    assert {"pydantic", "sqlalchemy", "muster"} <= set(part["environment"]["packages"])
    described = client.get_experiment(exp["id"])["trials"]
    assert [t["snapshot"] for t in described] == [part]


def test_the_best_trial_carries_its_snapshot(server: RunningServer, client: Client) -> None:
    stored = store_search(server)
    best = client.best_trial(stored["id"])
    assert best["snapshot"]["hparams"] == best["hparams"]


def test_two_experiments_differ_in_one_hyperparameter(server: RunningServer, client: Client,
                                                      tmp_path: Path) -> None:
    a = submit(client, tmp_path / "ctx", hyperparameters={"lr": 0.01})
    b = submit(client, tmp_path / "ctx", hyperparameters={"lr": 0.02})
    found = raw_diff(server, a["id"], b["id"])
    assert (found["a_trial"], found["a_basis"]) == (a["trials"][0]["id"], "latest")
    assert (found["b_trial"], found["b_basis"]) == (b["trials"][0]["id"], "latest")
    assert [(d["group"], d["field"], d["a"], d["b"], d["rank"])
            for d in found["differences"]] == [("config", "hparams.lr", 0.01, 0.02, None)]
    assert found["lines"] == ["lr: 0.01 vs 0.02"]
    same = raw_diff(server, a["id"], a["id"])
    assert (same["differences"], same["lines"]) == ([], [])


def test_a_search_is_represented_by_its_best_trial(server: RunningServer,
                                                   client: Client) -> None:
    stored = store_search(server)
    found = raw_diff(server, stored["id"], stored["id"])
    best = client.best_trial(stored["id"])["id"]
    assert (found["a_trial"], found["a_basis"], found["b_trial"]) == (best, "best", best)


def test_bad_experiments_are_4xx_that_name_them(server: RunningServer, client: Client,
                                                tmp_path: Path) -> None:
    exp = submit(client, tmp_path / "ctx")["id"]
    unknown = raw(server, f"/experiments/2147483647/diff/{exp}")
    assert unknown.status_code == 404
    assert "experiment 2147483647 does not exist" in unknown.json()["message"]
    assert raw(server, f"/experiments/{exp}/diff/2147483647").status_code == 404
    assert raw(server, f"/experiments/{exp}/diff/0").status_code == 422
    assert raw(server, f"/experiments/{exp}/diff/x").status_code == 422
    with server.store() as store, store.session_scope() as s:
        empty = add_experiment(s, search_config(), state="COMPLETED").id  # drew no trial
    answer = raw(server, f"/experiments/{exp}/diff/{empty}")
    assert answer.status_code == 409
    assert answer.json()["message"].startswith(f"experiment {empty} has no trial yet")


def raw_diff(server: RunningServer, a: int, b: int) -> dict[str, Any]:
    response = raw(server, f"/experiments/{a}/diff/{b}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found
