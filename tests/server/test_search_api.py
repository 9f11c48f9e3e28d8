"""Search progress through a real server and the SDK: `GET /experiments/{id}` (the `search`
block, each trial's `number`, `early_stop` and `best_validation`), `GET
/experiments/{id}/best` and `GET /experiments/{id}/trials?sort=METRIC`.

The rows are stored in the server's database from the test (as in test_search_views.py),
in COMPLETED experiments, so the supervisor has nothing to start or end for them.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from muster.client import Client, at_rest
from muster.errors import Conflict, InvalidRequest, NotFound
from tests.server.test_search_views import (
    add_experiment,
    add_many_trials,
    add_trial,
    losses,
    search_config,
)
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

STOP = {"rung": 0, "step": 1, "value": math.nan}


server = shared_server()


def raw(server: RunningServer, path: str, **params: str) -> httpx.Response:
    """A GET without the SDK, to see the status codes, with the server's token."""
    token = server.token
    return httpx.get(f"{server.url}/api/v1{path}", params=params, timeout=30,
                     headers={"Authorization": f"Bearer {token}"})


def store_search(server: RunningServer, **searcher: Any) -> dict[str, Any]:
    """A searched experiment of 6 trials, 4 made: number 0 SUCCEEDED (val_loss 0.4),
    1 SUCCEEDED and stopped early (0.2; its stop noted a NaN), 2 RUNNING (0.1, and a
    NaN), 3 PAUSED. Returns the ids."""
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=6, **searcher), state="COMPLETED",
                             max_trials=6)
        trials = [add_trial(s, exp, 0, validation=losses(0.5, 0.4)),
                  add_trial(s, exp, 1, validation=losses(0.2, math.nan), early_stop=STOP),
                  add_trial(s, exp, 2, "RUNNING", validation=losses(math.nan, 0.1)),
                  add_trial(s, exp, 3, "PAUSED")]
        return {"id": exp.id, "trials": [t.id for t in trials]}


def test_describe_shows_the_search_and_each_trials_place_in_it(
    server: RunningServer, client: Client
) -> None:
    stored = store_search(server)
    exp = client.get_experiment(stored["id"])
    t0, t1, *_ = stored["trials"]
    assert exp["search"] == {
        "searcher": "random", "metric": "val_loss", "smaller_is_better": True,
        "max_trials": 6, "max_concurrent_trials": 4, "max_length": None,
        "max_length_unit": "steps", "time_metric": None, "ended": 2, "running": 1, "queued": 1,
        "remaining": 2,
        "best": {"trial_id": t1, "number": 1, "hparams": {"lr": 0.002, "model": {"hidden": 64}},
                 "metric": "val_loss", "value": 0.2, "early_stopped": True},
        "objectives": [{"name": "val_loss", "smaller_is_better": True}]}
    trials = exp["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert [t["best_validation"] for t in trials] == [
        {"val_loss": 0.4}, {"val_loss": 0.2}, {"val_loss": 0.1}, {}]
    assert [t["early_stop"] for t in trials] == [
        None, {**STOP, "value": "NaN", "time": None}, None, None]
    assert trials[0]["id"] == t0 and {"restarts", "attempts", "hparams"} <= set(trials[0])


def test_a_time_metric_search_says_its_unit_and_where_a_trial_stopped(
        server: RunningServer, client: Client) -> None:
    config = search_config("asha", max_length=20, time_metric="epochs")
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, config, state="COMPLETED", max_trials=8)
        add_trial(s, exp, 0, validation=losses(0.5, 0.4),
                  early_stop={"rung": 1, "step": 80, "value": 0.4, "time": 4})
        experiment_id = exp.id
    search = client.get_experiment(experiment_id)["search"]
    assert (search["max_length"], search["time_metric"]) == (20, "epochs")
    page = httpx.get(f"{server.url}/experiments/{experiment_id}", timeout=30,
                     headers={"Authorization": f"Bearer {server.token}"})
    assert page.status_code == 200
    assert "rung 1 (epochs 4, step 80)" in page.text


def test_best_trial(server: RunningServer, client: Client) -> None:
    stored = store_search(server, smaller_is_better=False)
    best = client.best_trial(stored["id"])
    assert (best["id"], best["number"], best["best_validation"], best["state"]) == (
        stored["trials"][0], 0, {"val_loss": 0.5}, "SUCCEEDED")
    assert raw(server, f"/experiments/{stored['id']}/best").json() == best


def test_trials_sorted_by_a_metric(server: RunningServer, client: Client) -> None:
    stored = store_search(server)
    by_number = client.list_trials(stored["id"])
    assert [t["id"] for t in by_number] == stored["trials"]
    ranked = client.list_trials(stored["id"], sort="val_loss")
    assert [t["number"] for t in ranked] == [2, 1, 0, 3]
    first = {key: ranked[0][key] for key in ("state", "best_validation", "early_stopped")}
    assert first == {"state": "RUNNING", "best_validation": {"val_loss": 0.1},
                     "early_stopped": False}


def test_errors_say_what_to_do(server: RunningServer, client: Client) -> None:
    stored = store_search(server)
    with pytest.raises(InvalidRequest, match="sort by one of its validation metrics: val_loss"):
        client.list_trials(stored["id"], sort="val_acc")
    response = raw(server, f"/experiments/{stored['id']}/trials", sort="val_acc")
    assert (response.status_code, response.json()["error"]) == (400, "InvalidRequest")
    assert raw(server, f"/experiments/{stored['id']}/trials", sort="").status_code == 422

    with server.store() as store, store.session_scope() as s:
        unsettled = add_experiment(s, search_config(), state="COMPLETED")
        add_trial(s, unsettled, 0, "FAILED", validation=losses(0.1))
        single = add_experiment(s, search_config("single", metric=None), state="COMPLETED",
                                max_trials=1)
        add_trial(s, single, 0)
    with pytest.raises(NotFound, match="no SUCCEEDED trial with a finite 'val_loss' yet"):
        client.best_trial(unsettled.id)
    assert raw(server, f"/experiments/{unsettled.id}/best").status_code == 404
    with pytest.raises(Conflict, match="no searcher metric"):
        client.best_trial(single.id)
    assert raw(server, f"/experiments/{single.id}/best").status_code == 409
    for call in (client.best_trial, client.list_trials):
        with pytest.raises(NotFound, match="experiment 999999 does not exist"):
            call(999_999)


def test_describe_pages_a_search_of_thousands(server: RunningServer, client: Client) -> None:
    """2,500 trials: a page of 1,000 at most, `X-Total-Count` and `trials_next_offset`; the
    SDK reads them all a page at a time, and waits on the states of all, not of a page."""
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=2_500), state="ACTIVE",
                             max_trials=2_500)
        ids = add_many_trials(s, exp, 2_500, best_at=2_499)
    first = raw(server, f"/experiments/{exp.id}")
    assert (first.status_code, first.headers["X-Total-Count"]) == (200, "2500")
    assert [t["id"] for t in first.json()["trials"]] == ids[:1_000]
    page = raw(server, f"/experiments/{exp.id}", offset="2400", limit="50").json()
    assert ([t["id"] for t in page["trials"]], page["trials_next_offset"]) == (
        ids[2_400:2_450], 2_450)
    for bad in ({"limit": "1001"}, {"limit": "0"}, {"offset": "-1"}, {"offset": "x"}):
        refused = raw(server, f"/experiments/{exp.id}", **bad)
        assert refused.status_code == 422, (bad, refused.text)
    whole = client.get_experiment_whole(exp.id)
    assert [t["id"] for t in whole["trials"]] == ids
    assert whole["trials_next_offset"] is None
    assert not at_rest(whole)  # its last trial is RUNNING, on no page of the first 1,000
