"""`muster trial metrics`, `muster checkpoint list` and `muster trial review`, run as real
subprocesses against a real server (files ingested as in tests/server/test_metrics_api.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from muster.client import Client
from tests.cli.test_cli import assert_clean_failure, muster, on
from tests.server.test_metrics_api import STEPS, reported_trial, suspect_trial
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

@pytest.fixture(scope="module")
def reported(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with server.client() as client:
        return reported_trial(client, server, tmp_path_factory.mktemp("reported"))


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of a Rich table's body rows (box-drawing borders dropped)."""
    rows = []
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]
        if cells and not set(line) <= set("━─┏┓┗┛┡┩└┘┃│┳┻╇╈┼ ┠┨"):
            rows.append(cells)
    return rows


@pytest.mark.timeout(90)
def test_trial_metrics_table(server: RunningServer, reported: dict[str, Any]) -> None:
    done = on(server, "trial", "metrics", str(reported["id"]))
    assert done.returncode == 0, done.stderr
    header, *body = table_rows(done.stdout)
    assert header == ["Step", "Kind", "loss", "lr", "val_loss", "val_acc"]
    assert body[0] == ["1", "training", "1", "0.1", "-", "-"]
    assert body[-2] == [str(STEPS), "validation", "-", "-", "0.5", "0.75"]
    assert body[-1] == [str(STEPS + 1), "training", "NaN", "Infinity", "-", "-"]


@pytest.mark.timeout(90)
def test_trial_metrics_tail_and_kind(server: RunningServer, reported: dict[str, Any]) -> None:
    done = on(server, "trial", "metrics", str(reported["id"]), "--tail", "2")
    assert [row[:2] for row in table_rows(done.stdout)[1:]] == [
        [str(STEPS), "validation"], [str(STEPS + 1), "training"]]
    done = on(server, "t", "metrics", str(reported["id"]), "--kind", "validation", "--json")
    assert done.returncode == 0, done.stderr
    assert [(r["kind"], r["step"]) for r in json.loads(done.stdout)] == [("validation", STEPS)]
    done = on(server, "trial", "metrics", str(reported["id"]), "--kind", "test")
    assert done.returncode == 2 and "test" in done.stderr


@pytest.mark.timeout(90)
def test_trial_metrics_json_is_the_full_list(
    server: RunningServer, client: Client, reported: dict[str, Any]
) -> None:
    done = on(server, "trial", "metrics", str(reported["id"]), "--json")
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout)
    assert reports == client.all_metrics(reported["id"])
    assert len(reports) == STEPS + 2 and reports[-1]["metrics"]["loss"] == "NaN"


@pytest.mark.timeout(90)
def test_trial_metrics_errors_are_one_line(server: RunningServer) -> None:
    stderr = assert_clean_failure(on(server, "trial", "metrics", "999999"))
    assert "trial 999999 does not exist" in stderr


@pytest.mark.timeout(90)
def test_checkpoint_list(server: RunningServer, reported: dict[str, Any]) -> None:
    done = on(server, "checkpoint", "list", str(reported["id"]))
    assert done.returncode == 0, done.stderr
    header, *lines = table_rows(done.stdout)
    assert header == ["Id", "Trial", "Step", "Size", "State", "Metric", "Validated at",
                      "Storage", "Why"]
    body = [row for row in lines if row[0]]  # a long cell goes on over more lines
    assert [row[2] for row in body] == [str(STEPS), str(STEPS + 1)]
    assert "not intact" not in body[0][4] and "not intact" in body[1][4]
    assert "does not match its sha256" in body[1][8]
    done = on(server, "checkpoint", "list", str(reported["id"]), "--json")
    rows = json.loads(done.stdout)
    assert [(c["step"], c["intact"]) for c in rows] == [(STEPS, True), (STEPS + 1, False)]
    assert body[0][3] == f"{rows[0]['size_bytes']} B"  # under 1 KiB


@pytest.mark.timeout(90)
def test_review_approve_as_the_token_s_user(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    trial_id = suspect_trial(client, server, tmp_path)
    done = on(server, "trial", "review", str(trial_id), "--approve", "--note", "checked by hand")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"trial {trial_id} approved: SUCCEEDED"
    last = client.get_trial(trial_id)["events"][-1]
    assert (last["actor"], last["message"], last["to_state"]) == (
        "admin", "checked by hand", "SUCCEEDED")
    again = on(server, "trial", "review", str(trial_id), "--reject", "--note", "no")
    assert "only a SUSPECT trial" in assert_clean_failure(again)


@pytest.mark.timeout(90)
def test_a_review_is_recorded_as_the_reviewer_s_own_and_admins_review_anything(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    """The reviewer is who the token says, not a name the client sends: carol, a second
    admin, rejects a trial of the first admin's."""
    carol = client.create_user("carol", "admin")
    trial_id = suspect_trial(client, server, tmp_path)
    done = muster(server.home, server.url, "trial", "review", str(trial_id), "--reject",
                  "--note", "loss is NaN", "--json", token=carol["token"])
    assert done.returncode == 0, done.stderr
    trial = json.loads(done.stdout)
    assert trial["state"] == "FAILED" and trial["events"][-1]["actor"] == carol["name"]


@pytest.mark.timeout(90)
def test_review_needs_one_decision_and_a_note(server: RunningServer) -> None:
    for flags in ([], ["--approve", "--reject"]):
        done = on(server, "trial", "review", "1", *flags, "--note", "x")
        assert done.returncode == 2 and "exactly one of --approve and --reject" in done.stderr
    done = on(server, "trial", "review", "1", "--approve")
    assert done.returncode == 2 and "--note" in done.stderr
