"""What an export tells MLflow, planned without it (`muster.mlflow_export`): params from the
nested hyperparameters, rank 0's series with a retried step's later value, the tags of ids,
verdict, checks, acceptance and snapshot, and the bounds on what the caller gives. The
export against a real MLflow server is tests/server/test_mlflow_export.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from muster import api
from muster.errors import ExportError, InvalidRequest
from muster.mlflow_export import (
    MAX_METRIC_VALUES,
    ExportSource,
    check_registered_model,
    check_tracking_uri,
    collect_reports,
    connect,
    metric_points,
    plan_export,
    settled_artifacts,
)
from muster.states import ArtifactState, MetricKind, MetricSource


def _version(**change: Any) -> api.ModelVersionView:
    lineage = {"trial_id": 7, "trial_uuid": "t-uuid", "experiment_id": 3, "experiment": "mlp",
               "owner": "alice", "hparams": {"lr": 0.1, "opt": {"name": "sgd", "m": [1, 2]}},
               "checkpoint": {"uuid": "c-uuid", "name": "step-3-ab", "step": 3},
               "verification": {"verified": True, "checks": [
                   {"name": "completed", "passed": True, "detail": "3 of 3 steps",
                    "status": "passed"},
                   {"name": "samples", "passed": True, "detail": "warning: no manifest",
                    "status": "warning"}]},
               "verdict": "verified", "metrics": {"loss": 0.5},
               "snapshot": {"code": "a" * 64, "data": None}}
    version = api.ModelVersionView(
        model="mlp", version=2, stage="none", trial_id=7, experiment_id=3,
        checkpoint_uuid="c-uuid", verified=True, accepted_unverified=None,
        metrics={"loss": 0.5}, snapshot={"code": "a" * 64, "data": None}, lineage=lineage,
        registered_by="bob", registered_at=0.0)
    return api.ModelVersionView(**{**version, **change})  # type: ignore[typeddict-item]


def _report(kind: MetricKind, step: int, metrics: dict[str, api.Number], attempt: int = 1,
            rank: int = 0) -> api.MetricReport:
    return api.MetricReport(kind=kind, step=step, time=step + 0.5, attempt=attempt, rank=rank,
                            metrics=metrics, source=MetricSource.HARNESS)


def test_the_plan_has_the_params_tags_and_names_mlflow_needs(tmp_path: Path) -> None:
    source = ExportSource(_version(), [], tmp_path / "ckpt", None)
    plan = plan_export(source, "team.mlp")
    assert (plan.experiment, plan.run_name, plan.registered_model) == ("mlp", "mlp v2",
                                                                       "team.mlp")
    assert plan.params == [("lr", "0.1"), ("opt.m", "[1, 2]"), ("opt.name", "sgd")]
    assert {k: v for k, v in plan.tags.items() if not k.startswith("mlflow.note")} == {
        "muster.model": "mlp", "muster.model_version": "2", "muster.trial_id": "7",
        "muster.trial_uuid": "t-uuid", "muster.experiment_id": "3",
        "muster.experiment": "mlp", "muster.checkpoint_uuid": "c-uuid",
        "muster.checkpoint_name": "step-3-ab", "muster.checkpoint_step": "3",
        "muster.owner": "alice", "mlflow.user": "alice", "muster.registered_by": "bob",
        "muster.registered_at": "1970-01-01T00:00:00+00:00", "muster.verified": "true",
        "muster.verdict": "verified", "muster.check.completed": "passed: 3 of 3 steps",
        "muster.check.samples": "warning: no manifest",
        "muster.snapshot.code": "a" * 64, "muster.snapshot.data": ""}
    assert plan.tags["mlflow.note.content"].startswith(
        "muster model mlp v2: checkpoint step-3-ab (step 3) of trial 7 (experiment 3, 'mlp'), "
        "verified.")
    assert set(plan.version_tags) == {"muster.model", "muster.model_version",
                                      "muster.trial_id", "muster.experiment_id",
                                      "muster.checkpoint_uuid", "muster.verified"}


def test_an_unverified_version_carries_its_acceptance() -> None:
    accepted = api.AcceptedUnverified(reason="a baseline", by="root", at=60.0)
    plan = plan_export(ExportSource(_version(verified=False, accepted_unverified=accepted),
                                    [], Path("ckpt"), None), "mlp")
    assert plan.tags["muster.verified"] == "false"
    assert (plan.tags["muster.accepted_unverified.reason"],
            plan.tags["muster.accepted_unverified.by"],
            plan.tags["muster.accepted_unverified.at"]) == (
        "a baseline", "root", "1970-01-01T00:01:00+00:00")
    assert plan.version_tags["muster.accepted_unverified.reason"] == "a baseline"
    assert "NOT verified (verified); accepted by root: a baseline" in plan.description


def test_rank_0s_series_keep_a_retried_steps_later_value() -> None:
    points = metric_points([
        _report(MetricKind.TRAINING, 1, {"loss": 4.0}),
        _report(MetricKind.TRAINING, 2, {"loss": 3.0}),
        _report(MetricKind.TRAINING, 2, {"loss": 9.0}, rank=1),
        _report(MetricKind.VALIDATION, 2, {"loss": "NaN", "note": "text"}),
        _report(MetricKind.TRAINING, 2, {"loss": 2.5}, attempt=2),
        _report(MetricKind.TRAINING, 3, {"loss": "Infinity", "ok": True}, attempt=2),
    ])
    assert [(p.key, p.step, p.timestamp_ms) for p in points] == [
        ("training/loss", 1, 1500), ("training/loss", 2, 2500), ("training/loss", 3, 3500),
        ("validation/loss", 2, 2500)]
    assert [p.value for p in points[:3]] == [4.0, 2.5, math.inf]
    assert math.isnan(points[3].value)


def test_collecting_reports_pages_by_step_and_stops_at_the_bound() -> None:
    pages = {None: [_report(MetricKind.TRAINING, 1, {"a": 1})],
             1: [_report(MetricKind.TRAINING, 2, {"a": 2})], 2: []}
    assert [r["step"] for r in collect_reports(lambda after: pages[after], "trial 1")] == [1, 2]
    many = [_report(MetricKind.TRAINING, 1, {f"m{i}": i for i in range(MAX_METRIC_VALUES + 1)})]
    with pytest.raises(InvalidRequest, match="trial 1 reported more than 100,000 metric"):
        collect_reports(lambda after: many if after is None else [], "trial 1")


@pytest.mark.parametrize(("given", "kept"), [
    ("http://127.0.0.1:5000/", "http://127.0.0.1:5000"),
    ("https://mlflow.lab/team", "https://mlflow.lab/team")])
def test_a_tracking_uri_is_an_http_url(given: str, kept: str) -> None:
    assert check_tracking_uri(given) == kept


@pytest.mark.parametrize("given", ["mlflow.lab:5000", "file:///tmp/mlruns", "databricks",
                                   "http://", "http://a b", "http://x/" + "p" * 2048])
def test_anything_else_is_refused_saying_what_it_takes(given: str) -> None:
    with pytest.raises(InvalidRequest, match="--mlflow must be the http:// or https:// URL"):
        check_tracking_uri(given)


@pytest.mark.parametrize("given", ["team/mlp", "a:b", "", " mlp", "x" * 257])
def test_a_registered_model_name_is_what_mlflow_takes(given: str) -> None:
    with pytest.raises(InvalidRequest, match="--registered-model must be 1 to 256"):
        check_registered_model(given)
    assert check_registered_model("team.mlp v2_x-y") == "team.mlp v2_x-y"


def test_a_hyperparameter_too_long_for_mlflow_is_refused_by_name() -> None:
    version = _version()
    version["lineage"] = {**version["lineage"], "hparams": {"prompt": "x" * 6001}}
    with pytest.raises(InvalidRequest, match="hyperparameter 'prompt' is longer than MLflow"):
        plan_export(ExportSource(version, [], Path("ckpt"), None), "mlp")


def test_artifacts_still_being_copied_are_waited_for_a_while() -> None:
    states = iter([ArtifactState.PENDING, ArtifactState.COLLECTED])

    def fetch() -> api.ArtifactSetView:
        return {"state": next(states)}  # type: ignore[typeddict-item]

    assert settled_artifacts(fetch, 4)["state"] == ArtifactState.COLLECTED  # type: ignore[index]
    assert settled_artifacts(lambda: None, 4) is None
    with pytest.raises(ExportError, match="trial 4's artifacts are still being copied"):
        settled_artifacts(lambda: {"state": ArtifactState.PENDING},  # type: ignore[arg-type,return-value]
                          4, timeout=0.0)


def test_nothing_answering_fails_at_once_in_musters_words() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening
        with pytest.raises(ExportError, match=f"no MLflow tracking server answers at {url}"):
            connect(url)
