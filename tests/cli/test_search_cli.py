"""Search progress on the command line, run as real subprocesses against a real server:
`muster experiment describe` (the progress section), `muster experiment best` and
`muster trial list --sort`. The rows are stored in the server's database from the test."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from muster.client import Client
from tests.cli.test_cli import assert_clean_failure, on
from tests.server.test_search_views import (
    add_experiment,
    add_many_trials,
    add_trial,
    losses,
    search_config,
)
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

def store_search(server: RunningServer) -> dict[str, Any]:
    """8 trials planned, 5 made: numbers 0 and 1 SUCCEEDED (val_loss 0.4, and 0.2 stopped
    early at step 2), 2 FAILED (NaN), 3 RUNNING, 4 PAUSED (waiting, like a QUEUED trial,
    which the server would start)."""
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(), state="COMPLETED", max_trials=8)
        trials = [
            add_trial(s, exp, 0, validation=[{"val_loss": 0.4, "val_acc": 0.8}]),
            add_trial(s, exp, 1, validation=[{"val_loss": 0.3}, {"val_loss": 0.2}],
                      early_stop={"rung": 1, "step": 2, "value": 0.2},
                      hparams={"lr": 0.0125, "model": {"hidden": 128}, "opt": "[bold]"}),
            add_trial(s, exp, 2, "FAILED", validation=losses(math.nan)),
            add_trial(s, exp, 3, "RUNNING", validation=[{"val_acc": 0.5}]),
            add_trial(s, exp, 4, "PAUSED"),
        ]
        return {"id": exp.id, "trials": [t.id for t in trials]}


def row_of(output: str, trial_id: int) -> str:
    return next(line for line in output.splitlines() if line.split()[1:2] == [str(trial_id)])


def test_describe_shows_the_search_progress(server: RunningServer, client: Client) -> None:
    stored = store_search(server)
    done = on(server, "experiment", "describe", str(stored["id"]))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Search: "))
    assert lines[start:start + 4] == [
        "Search: random on val_loss (smaller is better), up to 4 trials at once",
        "Trials: 3 ended, 1 running, 1 queued, 3 remaining of 8",
        f"Best so far: trial {stored['trials'][1]} (number 1) (stopped early): val_loss 0.2",
        "  hparams: lr=0.0125, model.hidden=128, opt=[bold]",
    ]
    as_json = json.loads(on(server, "experiment", "describe", str(stored["id"]), "--json").stdout)
    assert as_json["search"] == client.get_experiment(stored["id"])["search"]
    assert [t["number"] for t in as_json["trials"]] == [0, 1, 2, 3, 4]


def test_describe_of_a_single_trial_experiment_has_no_search_section(
    server: RunningServer
) -> None:
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config("single", metric=None), state="COMPLETED",
                             max_trials=1)
        add_trial(s, exp, 0)
    done = on(server, "experiment", "describe", str(exp.id))
    assert done.returncode == 0, done.stderr
    assert "Search:" not in done.stdout and "Best so far" not in done.stdout


def test_experiment_best(server: RunningServer) -> None:
    stored = store_search(server)
    best_id = stored["trials"][1]
    done = on(server, "experiment", "best", str(stored["id"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"Trial {best_id} (number 1) of experiment {stored['id']}: val_loss 0.2",
        "hparams: lr=0.0125, model.hidden=128, opt=[bold]",
        "state: SUCCEEDED, stopped early by the searcher at step 2 (rung 1)",
    ]
    best = json.loads(on(server, "experiment", "best", str(stored["id"]), "--json").stdout)
    assert (best["id"], best["best_validation"], best["early_stop"]) == (
        best_id, {"val_loss": 0.2}, {"rung": 1, "step": 2, "value": 0.2, "time": None})


def test_experiment_best_before_any_success_is_one_line(server: RunningServer) -> None:
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(), state="COMPLETED")
        add_trial(s, exp, 0, "RUNNING", validation=losses(0.1))
    stderr = assert_clean_failure(on(server, "experiment", "best", str(exp.id)))
    assert "no SUCCEEDED trial with a finite 'val_loss' yet" in stderr


def test_trial_list_sorted(server: RunningServer) -> None:
    stored = store_search(server)
    done = on(server, "trial", "list", str(stored["id"]), "--sort", "val_acc")
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("┃"))
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == [
        "Trial", "Number", "State", "Verdict", "Early stopped", "val_acc", "val_loss",
        "Hyperparameters"]
    ids = stored["trials"]
    order = [ids[3], ids[0], ids[1], ids[2], ids[4]]  # val_acc 0.5, 0.8, then without
    positions = [done.stdout.index(row_of(done.stdout, trial_id)) for trial_id in order]
    assert positions == sorted(positions)
    early = row_of(done.stdout, ids[1]).split("│")
    assert [cell.strip() for cell in early[2:-1]] == [
        "1", "SUCCEEDED", "exit 0 — not verified (stopped early by the searcher): no "
        "verification recorded", "yes", "-", "0.2", "lr=0.0125, model.hidden=128, opt=[bold]"]
    rows = json.loads(on(server, "trial", "list", str(stored["id"]), "--json").stdout)
    assert [row["id"] for row in rows] == ids


def test_trial_list_by_an_unknown_metric_is_one_line(server: RunningServer) -> None:
    stored = store_search(server)
    stderr = assert_clean_failure(on(server, "trial", "list", str(stored["id"]),
                                     "--sort", "accuracy"))
    assert "sort by one of its validation metrics: val_acc, val_loss" in stderr


def test_describe_pages_the_trials_and_says_how_to_see_the_rest(server: RunningServer) -> None:
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config(max_trials=1_200), state="COMPLETED",
                             max_trials=1_200)
        ids = add_many_trials(s, exp, 1_200, best_at=1_150)
    done = on(server, "experiment", "describe", str(exp.id), "--trials-offset", "1190",
              "--trials-limit", "5")
    assert done.returncode == 0, done.stderr
    assert (f"trials 1,191 to 1,195 of 1,200 shown; the next: muster experiment describe "
            f"{exp.id} --trials-offset 1195") in done.stdout
    assert f"Best so far: trial {ids[1_150]} (number 1150)" in done.stdout
    shown = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("Trial ")}
    assert shown == {str(trial_id) for trial_id in ids[1_190:1_195]}
    as_json = json.loads(on(server, "experiment", "describe", str(exp.id), "--json").stdout)
    assert (len(as_json["trials"]), as_json["trials_total"], as_json["trials_next_offset"]) == (
        1_000, 1_200, 1_000)
    refused = on(server, "experiment", "describe", str(exp.id), "--trials-limit", "1001")
    assert (refused.returncode, "Traceback" in refused.stderr) == (2, False)
    assert "--trials-limit" in refused.stderr and "1<=x<=1000" in refused.stderr
