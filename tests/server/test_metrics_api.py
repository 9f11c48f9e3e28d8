"""Metrics, checkpoints and reviews through a real server and the SDK.

A fixture script writes metrics lines (one a NaN) and checkpoint directories in the
documented format, so its trial ends SUSPECT by verification. The supervisor ingests the
files in the server; calling `ingest_trial` here as well shows that a second ingestion adds
nothing. For the review tests, SUSPECT is also entered with `transition` on the server's
database while a trial still runs, to cover a review racing the end of the process.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import Conflict, InvalidRequest, NotFound
from muster.states import TrialState
from muster.store import Trial, transition
from muster.supervise.ingest import ingest_trial
from tests.server.experiments import (
    create,
    only_trial,
    run_to_end,
    wait_ended,
    wait_trial,
)
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

STEPS = 5
REPORT_KEYS = {"kind", "step", "time", "attempt", "rank", "metrics", "source"}
CHECKPOINT_KEYS = {"id", "uuid", "trial_id", "name", "path", "step", "state", "size",
                   "storage_url", "metric", "metric_step", "kept_because", "deleted_because",
                   "error", "stored_at", "attempt", "rank", "created_at", "size_bytes",
                   "file_count", "metadata", "intact", "problem"}
_releases = itertools.count(1)


server = shared_server()


def raw(server: RunningServer, method: str, path: str, **kw: Any) -> httpx.Response:
    """A request without the SDK (whose 422 is a ConfigError), with the server's token."""
    token = server.token
    return httpx.request(method, f"{server.url}/api/v1{path}",
                         headers={"Authorization": f"Bearer {token}"}, timeout=30, **kw)


def assert_invalid(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "InvalidRequest"
    assert all(word in body["message"] for word in words), body


def ingest(server: RunningServer, trial_id: int) -> None:
    """Ingest the trial's run directory into the server's database, from this process."""
    with server.store() as store:
        ingest_trial(store, trial_id)


def reported_trial(client: Client, server: RunningServer, parent: Path) -> dict[str, Any]:
    """A trial that ran `report_metrics.py` to its end, with its files ingested."""
    exp = create(client, parent, "report_metrics.py", str(STEPS))
    trial = wait_trial(client, int(only_trial(exp)["id"]), {"SUSPECT"})
    # It reported a NaN: exit 0, yet not a success (invariant 1).
    failed = [c for c in trial["verification"]["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["finite_metrics"], trial["verification"]
    ingest(server, trial["id"])
    return trial


def suspect_trial(client: Client, server: RunningServer, parent: Path) -> int:
    """A trial whose process runs (and waits), moved from RUNNING to SUSPECT directly."""
    release = parent / f"release-{next(_releases)}"
    exp = create(client, parent, "report_metrics.py", "1", str(release))
    trial_id = int(only_trial(exp)["id"])
    wait_trial(client, trial_id, {"RUNNING"})
    with server.store() as store, store.session_scope() as s:
        transition(s, s.get_one(Trial, trial_id), TrialState.SUSPECT,
                   reason="verification failed", actor="test",
                   message="samples seen 10 but the manifest has 12")
    return trial_id


@pytest.fixture(scope="module")
def reported(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with server.client() as client:
        return reported_trial(client, server, tmp_path_factory.mktemp("reported"))


# -- metrics ------------------------------------------------------------------------------


def test_metrics_come_back_in_step_order_with_their_origin(
    client: Client, reported: dict[str, Any]
) -> None:
    reports = client.get_metrics(reported["id"])
    assert all(set(r) == REPORT_KEYS for r in reports)
    assert [(r["kind"], r["step"]) for r in reports] == [
        *(("training", step) for step in range(1, STEPS + 1)),
        ("validation", STEPS), ("training", STEPS + 1)]
    assert {(r["attempt"], r["rank"], r["source"]) for r in reports} == {(1, 0, "harness")}
    assert reports[0]["metrics"] == {"loss": 1.0, "lr": 0.1}
    assert reports[STEPS]["metrics"] == {"val_loss": 0.5, "val_acc": 0.75}
    assert all(isinstance(r["time"], float) for r in reports)


def test_non_finite_values_are_json_strings(
    server: RunningServer, reported: dict[str, Any]
) -> None:
    response = raw(server, "GET", f"/trials/{reported['id']}/metrics")

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in the response: it is not strict JSON")

    reports = json.loads(response.text, parse_constant=refuse)
    assert reports[-1]["metrics"] == {"loss": "NaN", "lr": "Infinity"}


def test_kind_filter_and_tail(client: Client, reported: dict[str, Any]) -> None:
    validation = client.get_metrics(reported["id"], kind="validation")
    assert [(r["kind"], r["step"]) for r in validation] == [("validation", STEPS)]
    last_two = client.get_metrics(reported["id"], tail=2)
    assert [(r["kind"], r["step"]) for r in last_two] == [
        ("validation", STEPS), ("training", STEPS + 1)]
    training_tail = client.get_metrics(reported["id"], kind="training", tail=1)
    assert [r["step"] for r in training_tail] == [STEPS + 1]


def test_a_page_never_ends_inside_a_step(client: Client, reported: dict[str, Any]) -> None:
    page = client.get_metrics(reported["id"], limit=STEPS)  # its last report shares a step
    assert [(r["kind"], r["step"]) for r in page][-2:] == [
        ("training", STEPS), ("validation", STEPS)]
    rest = client.get_metrics(reported["id"], after_step=page[-1]["step"], limit=STEPS)
    assert [(r["kind"], r["step"]) for r in rest] == [("training", STEPS + 1)]
    assert client.all_metrics(reported["id"]) == client.get_metrics(reported["id"])
    assert client.get_metrics(reported["id"], after_step=STEPS + 1) == []


def test_metrics_errors(server: RunningServer, client: Client, reported: dict[str, Any]) -> None:
    with pytest.raises(NotFound, match="trial 999999 does not exist"):
        client.get_metrics(999_999)
    path = f"/trials/{reported['id']}/metrics"
    assert_invalid(raw(server, "GET", path, params={"kind": "test"}), "kind", "training")
    assert_invalid(raw(server, "GET", path, params={"limit": 0}), "limit")


def test_ingesting_again_adds_nothing(
    server: RunningServer, client: Client, reported: dict[str, Any]
) -> None:
    before = client.get_metrics(reported["id"])
    ingest(server, reported["id"])
    assert client.get_metrics(reported["id"]) == before


# -- checkpoints --------------------------------------------------------------------------


def test_checkpoints_are_listed_with_their_integrity(
    client: Client, reported: dict[str, Any]
) -> None:
    rows = client.list_checkpoints(reported["id"])
    assert all(set(c) == CHECKPOINT_KEYS for c in rows)
    assert [(c["step"], c["intact"]) for c in rows] == [(STEPS, True), (STEPS + 1, False)]
    good, bad = rows
    assert good["problem"] is None and good["metadata"] == {"note": "fixture"}
    assert (good["attempt"], good["rank"], good["file_count"]) == (1, 0, 2)
    assert good["size_bytes"] == 700 + (Path(good["path"]) / "metadata.json").stat().st_size
    assert Path(good["path"]).name == good["name"] and good["name"].startswith("step-")
    assert bad["problem"] == "state.bin does not match its sha256 in metadata.json"
    assert not any(".tmp" in c["name"] for c in rows)


def test_checkpoints_of_an_unknown_trial(client: Client) -> None:
    with pytest.raises(NotFound):
        client.list_checkpoints(999_999)


def test_trial_detail_has_the_verification_fields(
    client: Client, reported: dict[str, Any]
) -> None:
    trial = client.get_trial(reported["id"])
    assert {k: trial[k] for k in ("manifest", "early_stopped", "queue_reason")} == {
        "manifest": None, "early_stopped": False, "queue_reason": None}  # no `data:` section
    assert trial["verification"]["passed"] is False
    checks = {c["name"]: c for c in trial["verification"]["checks"]}
    assert checks["finite_metrics"]["passed"] is False and "NaN" in checks["finite_metrics"][
        "detail"]
    assert "checkpoint" not in checks  # the script wrote files by hand: no harness check-in
    assert {"id", "state", "restarts", "attempts", "events"} <= set(trial)


# -- review -------------------------------------------------------------------------------


def test_approving_a_suspect_trial_makes_it_succeed(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    trial_id = suspect_trial(client, server, tmp_path)
    trial = client.review_trial(trial_id, "approve", "the samples check is off by design")
    assert trial["state"] == "SUCCEEDED" and trial["reason"] == "review approved"
    last = trial["events"][-1]
    assert (last["from_state"], last["to_state"], last["actor"], last["reason"],
            last["message"]) == ("SUSPECT", "SUCCEEDED", "admin", "review approved",
                                 "the samples check is off by design")
    assert wait_ended(client, trial["experiment_id"])["state"] == "COMPLETED"
    with pytest.raises(Conflict, match=rf"trial {trial_id} is SUCCEEDED; only a SUSPECT"):
        client.review_trial(trial_id, "reject", "changed my mind")


def test_rejecting_a_suspect_trial_makes_it_fail(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    trial_id = suspect_trial(client, server, tmp_path)
    trial = client.review_trial(trial_id, "reject", "loss went NaN")
    assert (trial["state"], trial["reason"], trial["message"]) == (
        "FAILED", "review rejected", "loss went NaN")
    assert trial["events"][-1]["actor"] == "admin"


def test_a_review_needs_a_decision_and_a_note_and_the_client_s_reviewer_is_not_believed(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    trial_id = suspect_trial(client, server, tmp_path)
    with pytest.raises(InvalidRequest, match="needs a note"):
        client.review_trial(trial_id, "approve", "   ")
    path = f"/trials/{trial_id}/review"
    assert_invalid(raw(server, "POST", path,
                       json={"decision": "maybe", "note": "hmm", "reviewer": "alice"}),
                   "decision")
    assert_invalid(raw(server, "POST", path, json={"decision": "approve", "reviewer": "a"}),
                   "note")
    assert client.get_trial(trial_id)["state"] == "SUSPECT"
    # An older client still sends `reviewer`: the review is the token's user's all the same.
    done = raw(server, "POST", path, json={"decision": "approve", "note": "ok",
                                           "reviewer": "mallory"})
    assert done.status_code == 200, done.text
    assert done.json()["events"][-1]["actor"] == "admin"


def test_only_a_suspect_trial_can_be_reviewed(client: Client, tmp_path: Path) -> None:
    succeeded = only_trial(run_to_end(client, tmp_path, "exit0.sh"))
    with pytest.raises(Conflict) as caught:
        client.review_trial(succeeded["id"], "approve", "looks fine")
    assert str(caught.value) == (
        f"trial {succeeded['id']} is SUCCEEDED; only a SUSPECT trial (one that exited 0 but "
        "failed a verification) can be reviewed")
    with pytest.raises(NotFound):
        client.review_trial(999_999, "approve", "looks fine")
