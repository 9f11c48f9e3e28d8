"""Hand a model version to MLflow: one MLflow run holding the trial's hyperparameters (as
params), its metric series, muster's ids and verdict (as tags), and the version's checkpoint
and the trial's artifacts (as files), then a version in MLflow's model registry that links
to that run.

Two callers gather what to export, each as the one who may read it: the CLI (`muster model
export NAME@V --mlflow URI`), as the user, from what muster's API serves, so the server
never reaches an address a user names; and the server, from its own store and files, for
the MLflow server its cluster config names (`mlflow:`). Each makes an `ExportSource`;
`plan_export` turns it into what MLflow is told (pure), and `push` tells it. MLflow's client
(`mlflow-skinny`, the `muster[mlflow]` extra) is imported by `connect` alone, which each
caller asks first, before it gathers anything.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from muster import api
from muster.errors import ExportError, InvalidRequest, NotFound
from muster.metrics_lines import REPORTED_KINDS
from muster.states import ArtifactState, MetricKind
from muster.verdicts import check_status

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from muster.client import Client

__all__ = ["INSTALL_HINT", "MAX_METRIC_VALUES", "ExportPlan", "ExportSource", "MetricPoint",
           "Mlflow", "check_registered_model", "check_tracking_uri", "collect_reports",
           "connect", "export_through_api", "metric_points", "plan_export", "push", "run_tags",
           "settled_artifacts"]

INSTALL_HINT = "pip install 'muster[mlflow]'"
# Every metric value of every report read is counted: past this the export is refused
# (a trial that reported more is summarised better than copied).
MAX_METRIC_VALUES = 100_000
# MLflow's own limits (mlflow.utils.validation): per log_batch request, and per value.
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100  # and tags
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
MAX_CHECKS = 100  # tags of the verification's checks, the first
MAX_URI = 2048
MAX_REGISTERED_MODEL = 256
MAX_ERROR = 1000  # of what MLflow said, in an error or an event
PROBE_TIMEOUT = 10.0  # seconds for the tracking server to answer at all
ARTIFACTS_WAIT = 120.0  # seconds for a trial's artifact set to be copied, at most
ARTIFACTS_POLL = 0.5
REPORTS_PAGE = 10_000  # metric reports a page (the API's default)
_URI = re.compile(r"https?://[^\s/]+(/\S*)?")
_REGISTERED_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]*")  # MLflow's: no / or :


@dataclass(frozen=True)
class ExportSource:
    """What to export of one model version, gathered by the CLI or the server."""

    version: api.ModelVersionView  # with its lineage
    reports: Sequence[api.MetricReport]  # the trial's, as `collect_reports` read them
    checkpoint_dir: Path  # the version's checkpoint, unpacked and checked (metadata.json too)
    artifacts_dir: Path | None  # the trial's artifact set, downloaded and checked; None: none


@dataclass(frozen=True)
class MetricPoint:
    key: str
    value: float
    timestamp_ms: int
    step: int


@dataclass(frozen=True)
class ExportPlan:
    """What MLflow is told, in the order `push` tells it."""

    model: str
    version: int
    experiment: str  # MLflow's experiment: the muster experiment's name
    run_name: str
    params: list[tuple[str, str]]
    tags: dict[str, str]
    metrics: list[MetricPoint]
    checkpoint_dir: Path
    artifacts_dir: Path | None
    registered_model: str
    version_tags: dict[str, str]  # of MLflow's model version
    description: str  # of MLflow's model version (the run's is its `mlflow.note.content`)


# -- what the caller gives -----------------------------------------------------------------


def check_tracking_uri(uri: str, where: str = "--mlflow") -> str:
    """The MLflow tracking server's URL, without a trailing slash.

    Raises:
        InvalidRequest: not an http(s) URL of at most 2,048 characters (said where).
    """
    if len(uri) > MAX_URI or not _URI.fullmatch(uri):
        raise InvalidRequest(f"{where} must be the http:// or https:// URL of an MLflow "
                             f"tracking server, such as http://mlflow.lab:5000, got {uri[:100]!r}")
    return uri.rstrip("/")


def check_registered_model(name: str, where: str = "--registered-model") -> str:
    """A name for MLflow's model registry.

    Raises:
        InvalidRequest: not 1 to 256 letters, digits, spaces and . _ -.
    """
    if len(name) > MAX_REGISTERED_MODEL or not _REGISTERED_MODEL.fullmatch(name):
        raise InvalidRequest(f"{where} must be 1 to {MAX_REGISTERED_MODEL} letters, digits, "
                             f"spaces and . _ -, the first a letter or digit, got "
                             f"{name[:100]!r}")
    return name


def collect_reports(fetch: Callable[[int | None], Sequence[api.MetricReport]], what: str
                    ) -> list[api.MetricReport]:
    """Every report `fetch(after_step)` pages through (a page never ends inside a step),
    at most MAX_METRIC_VALUES values in all.

    Raises:
        InvalidRequest: `what` reported more than that.
    """
    reports: list[api.MetricReport] = []
    values = 0
    after_step: int | None = None
    while page := fetch(after_step):
        values += sum(len(report["metrics"]) for report in page)
        if values > MAX_METRIC_VALUES:
            raise InvalidRequest(f"{what} reported more than {MAX_METRIC_VALUES:,} metric "
                                 "values; an export to MLflow copies at most that many")
        reports += page
        after_step = page[-1]["step"]
    return reports


def settled_artifacts(fetch: Callable[[], api.ArtifactSetView | None], trial_id: int,
                      timeout: float = ARTIFACTS_WAIT) -> api.ArtifactSetView | None:
    """The trial's artifact set as `fetch` gives it (None: it has none), once copied: a
    trial registered as soon as it ended may still have its set `pending` a moment.

    Raises:
        ExportError: still pending after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while (found := fetch()) is not None and found["state"] == ArtifactState.PENDING:
        if time.monotonic() > deadline:
            raise ExportError(f"trial {trial_id}'s artifacts are still being copied after "
                              f"{timeout:g} s; export again once `muster trial artifacts "
                              f"{trial_id}` lists them")
        time.sleep(ARTIFACTS_POLL)
    return found


def export_through_api(client: Client, ref: str, tracking_uri: str,
                       registered_model: str | None, work: Path) -> api.MlflowExport:
    """Export the version `ref` names (`NAME@3`, `NAME@production`...) as `client`'s user
    reads it from muster's API, into `work` first, to the MLflow server at `tracking_uri`
    (reached from here), registered there as `registered_model` (default: its muster name).

    Raises:
        InvalidRequest: `ref` or `registered_model` is not acceptable, or the trial
            reported more metric values than an export takes.
        NotFound: no such model or version.
        ExportError: as `connect` and `push`.
    """
    mlflow = connect(tracking_uri)
    version = client.get_model_version(ref)
    name = check_registered_model(registered_model or version["model"])
    trial_id = version["trial_id"]
    reports = collect_reports(
        lambda after: client.get_metrics(trial_id, after_step=after, limit=REPORTS_PAGE),
        f"trial {trial_id}")
    checkpoint = work / "checkpoint"
    client.download_checkpoint_by_ref(version["checkpoint_uuid"], checkpoint)
    found = settled_artifacts(lambda: _artifact_set(client, trial_id), trial_id)
    artifacts = None
    if found is not None and found["files"]:
        artifacts = work / "artifacts"
        client.download_artifacts(trial_id, artifacts)
    source = ExportSource(version=version, reports=reports, checkpoint_dir=checkpoint,
                          artifacts_dir=artifacts)
    return push(plan_export(source, name), mlflow)


def _artifact_set(client: Client, trial_id: int) -> api.ArtifactSetView | None:
    try:
        return client.get_artifacts(trial_id)
    except NotFound:
        return None


# -- the plan ------------------------------------------------------------------------------


def plan_export(source: ExportSource, registered_model: str) -> ExportPlan:
    """What MLflow is told of `source`, its version registered as `registered_model`.

    Raises:
        InvalidRequest: a hyperparameter's name or value is longer than MLflow takes.
    """
    version = source.version
    lineage = version["lineage"]
    name, number = version["model"], version["version"]
    tags = run_tags(version)
    return ExportPlan(
        model=name, version=number,
        experiment=str(lineage.get("experiment") or "muster"),
        run_name=f"{name} v{number}",
        params=_params(lineage.get("hparams") or {}),
        tags=tags,
        metrics=metric_points(source.reports),
        checkpoint_dir=source.checkpoint_dir, artifacts_dir=source.artifacts_dir,
        registered_model=registered_model,
        version_tags={key: value for key, value in tags.items() if key in _VERSION_TAGS},
        description=_description(version))


_VERSION_TAGS = frozenset({"muster.model", "muster.model_version", "muster.trial_id",
                           "muster.experiment_id", "muster.checkpoint_uuid", "muster.verified",
                           "muster.accepted_unverified.reason",
                           "muster.accepted_unverified.by"})


def _params(hparams: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The hyperparameters as MLflow params: nested names joined with dots, values as
    written (strings) or as JSON."""
    params = []
    for key, value in _flattened(hparams, ""):
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        if len(key) > MAX_KEY or len(text) > MAX_PARAM_VALUE:
            raise InvalidRequest(f"hyperparameter {key[:100]!r} is longer than MLflow takes "
                                 f"(names up to {MAX_KEY} characters, values up to "
                                 f"{MAX_PARAM_VALUE}); it cannot be exported as a param")
        params.append((key, text))
    return params


def _flattened(values: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in sorted(values.items()):
        if isinstance(value, Mapping) and value:
            yield from _flattened(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def run_tags(version: api.ModelVersionView) -> dict[str, str]:
    """The run's tags: muster's ids, the owner (also as MLflow's `mlflow.user`), the
    verdict and each check, an unverified version's acceptance, the snapshot's keys."""
    lineage = version["lineage"]
    checkpoint = lineage.get("checkpoint") or {}
    verification = lineage.get("verification") or {}
    tags = {
        "muster.model": version["model"], "muster.model_version": str(version["version"]),
        "muster.trial_id": str(version["trial_id"]),
        "muster.trial_uuid": str(lineage.get("trial_uuid", "")),
        "muster.experiment_id": str(version["experiment_id"]),
        "muster.experiment": str(lineage.get("experiment", "")),
        "muster.checkpoint_uuid": version["checkpoint_uuid"],
        "muster.checkpoint_name": str(checkpoint.get("name", "")),
        "muster.checkpoint_step": str(checkpoint.get("step", "")),
        "muster.owner": str(lineage.get("owner") or ""),
        "mlflow.user": str(lineage.get("owner") or version["registered_by"]),
        "muster.registered_by": version["registered_by"],
        "muster.registered_at": _when(version["registered_at"]),
        "muster.verified": "true" if version["verified"] else "false",
        "muster.verdict": str(lineage.get("verdict", "")),
        "mlflow.note.content": _description(version),
    }
    for check in (verification.get("checks") or [])[:MAX_CHECKS]:
        if isinstance(check, Mapping) and check.get("name"):
            tags[f"muster.check.{check['name']}"] = _check_line(check)
    accepted = version["accepted_unverified"]
    if accepted is not None:
        tags |= {"muster.accepted_unverified.reason": accepted["reason"],
                 "muster.accepted_unverified.by": accepted["by"],
                 "muster.accepted_unverified.at": _when(accepted["at"])}
    for key, value in sorted(version["snapshot"].items()):
        tags[f"muster.snapshot.{key}"] = "" if value is None else str(value)
    return {key[:MAX_KEY]: _cut(value, MAX_TAG_VALUE) for key, value in tags.items()}


def _check_line(check: Mapping[str, Any]) -> str:
    """`passed: 3 of 3 steps`; a detail that starts with its status word is kept whole
    ("warning: ...", "not run: ...")."""
    status, detail = check_status(check), str(check.get("detail") or "")
    if detail.lower().startswith(status.value.replace("_", " ") + ":"):
        return detail
    return f"{status}: {detail}"


def metric_points(reports: Sequence[api.MetricReport]) -> list[MetricPoint]:
    """Rank 0's series, `training/<name>` and `validation/<name>`, by step; where attempts
    reported a step twice (a retry resumed from an earlier checkpoint), the later attempt's
    value, as the trial's curves show it."""
    latest: dict[tuple[str, int], tuple[int, float, int]] = {}
    for report in reports:
        if report["rank"] != 0 or report["kind"] not in REPORTED_KINDS:
            continue  # resource samples are the machine's, not the run's results
        kind = "training" if report["kind"] == MetricKind.TRAINING else "validation"
        for name, raw in report["metrics"].items():
            value = _number(raw)
            key = (f"{kind}/{name}", report["step"])
            if value is not None and latest.get(key, (-1, 0.0, 0))[0] <= report["attempt"]:
                latest[key] = (report["attempt"], value, int(report["time"] * 1000))
    return [MetricPoint(key, value, at, step) for (key, step), (_, value, at)
            in sorted(latest.items(), key=lambda item: (item[0][0], item[0][1]))]


def _number(raw: object) -> float | None:
    """A metric value as MLflow takes it ("NaN" and "±Infinity" too); None: not a number."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        return float(raw)
    if raw in ("NaN", "Infinity", "-Infinity"):
        return float(str(raw).lower().replace("infinity", "inf"))
    return None


def _description(version: api.ModelVersionView) -> str:
    lineage = version["lineage"]
    checkpoint = lineage.get("checkpoint") or {}
    accepted = version["accepted_unverified"]
    verdict = ("verified" if version["verified"] else
               f"NOT verified ({lineage.get('verdict', '')}); accepted by {accepted['by']}: "
               f"{accepted['reason']}" if accepted else "NOT verified")
    return (f"muster model {version['model']} v{version['version']}: checkpoint "
            f"{checkpoint.get('name', version['checkpoint_uuid'])} (step "
            f"{checkpoint.get('step', '?')}) of trial {version['trial_id']} (experiment "
            f"{version['experiment_id']}, {lineage.get('experiment', '')!r}), {verdict}. "
            f"Registered by {version['registered_by']} at {_when(version['registered_at'])}.")


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# -- telling MLflow ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mlflow:
    """MLflow's client of one tracking server (and its registry), and the errors it raises."""

    uri: str
    client: MlflowClient
    failures: tuple[type[Exception], ...]


def connect(tracking_uri: str) -> Mlflow:
    """MLflow's client of the server at `tracking_uri`, once something answers there: asked
    before anything is gathered, so a wrong URL or a missing client costs no download.

    Raises:
        ExportError: MLflow's client is not installed, or nothing answers (MLflow's client
            would retry a refused connection for minutes).
    """
    import httpx

    try:
        httpx.get(f"{tracking_uri}/api/2.0/mlflow/experiments/get-by-name",
                  params={"experiment_name": "muster"}, timeout=PROBE_TIMEOUT)
    except httpx.TransportError as exc:
        raise ExportError(f"no MLflow tracking server answers at {tracking_uri} ({exc}); "
                          "start it, or name the one that runs") from exc
    # MLflow prints "View run ... at" to stdout when a run ends; muster prints its own
    # links, and stdout is the CLI's --json (or the server's log). A value set is kept.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from requests import RequestException
    except ImportError as exc:
        raise ExportError(f"MLflow's client is not installed here ({exc}): "
                          f"{INSTALL_HINT}") from exc
    return Mlflow(tracking_uri,
                  MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri),
                  (MlflowException, RequestException, OSError))


def push(plan: ExportPlan, mlflow: Mlflow) -> api.MlflowExport:
    """Make the run and the registered version `plan` says; what was made. A run left half
    made is marked FAILED.

    Raises:
        ExportError: MLflow refused or broke off (its words).
    """
    client, uri = mlflow.client, mlflow.uri
    run_id: str | None = None
    try:
        experiment_id = _experiment(client, plan.experiment)
        run_id = client.create_run(experiment_id, run_name=plan.run_name, tags={
            "mlflow.user": plan.tags["mlflow.user"]}).info.run_id
        _log(client, run_id, plan)
        client.set_terminated(run_id)
        _registered_model(client, plan.registered_model)
        made = client.create_model_version(
            plan.registered_model, source=f"runs:/{run_id}/checkpoint", run_id=run_id,
            tags=plan.version_tags, description=plan.description)
    except mlflow.failures as exc:
        raise ExportError(f"the export of {plan.model} v{plan.version} to MLflow at {uri} "
                          f"failed: {_cut(str(exc), MAX_ERROR)}"
                          + _abandoned(mlflow, run_id)) from exc
    return api.MlflowExport(
        model=plan.model, version=plan.version, tracking_uri=uri,
        experiment_id=experiment_id, run_id=run_id,
        run_url=f"{uri}/#/experiments/{experiment_id}/runs/{run_id}",
        registered_model=plan.registered_model, model_version=int(made.version),
        model_version_url=(f"{uri}/#/models/{quote(plan.registered_model, safe='')}"
                           f"/versions/{made.version}"))


def _experiment(client: MlflowClient, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    from mlflow.exceptions import RestException

    try:
        return str(client.create_experiment(name))
    except RestException as exc:  # made by another export meanwhile
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        again = client.get_experiment_by_name(name)
        if again is None:
            raise
        return str(again.experiment_id)


def _registered_model(client: MlflowClient, name: str) -> None:
    from mlflow.exceptions import RestException

    try:
        client.create_registered_model(name, description="registered from muster")
    except RestException as exc:  # it exists: versions are added to it
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _log(client: MlflowClient, run_id: str, plan: ExportPlan) -> None:
    """Params, tags and metrics in batches of MLflow's limits, then the files."""
    from mlflow.entities import Metric, Param, RunTag

    for params in _batches(plan.params, PARAMS_PER_BATCH):
        client.log_batch(run_id, params=[Param(k, v) for k, v in params], synchronous=True)
    for tags in _batches(sorted(plan.tags.items()), PARAMS_PER_BATCH):
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags], synchronous=True)
    for points in _batches(plan.metrics, METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=[Metric(p.key, p.value, p.timestamp_ms, p.step)
                                          for p in points], synchronous=True)
    client.log_artifacts(run_id, os.fspath(plan.checkpoint_dir), "checkpoint")
    if plan.artifacts_dir is not None:
        client.log_artifacts(run_id, os.fspath(plan.artifacts_dir), "artifacts")


_Item = TypeVar("_Item")


def _batches(items: Sequence[_Item], size: int) -> Iterator[Sequence[_Item]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _abandoned(mlflow: Mlflow, run_id: str | None) -> str:
    """Mark a half-made run FAILED; what the error message adds about it."""
    if run_id is None:
        return ""
    try:
        mlflow.client.set_terminated(run_id, status="FAILED")
    except mlflow.failures as exc:
        return f"; its MLflow run {run_id} is half made, and could not be marked FAILED ({exc})"
    return f"; its MLflow run {run_id} is marked FAILED"
