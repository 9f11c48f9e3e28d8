"""The server's exports of model versions to the MLflow tracking server its cluster config
names (`mlflow:`), gathered from its own store and files and told by `muster.mlflow_export`;
each export, made or failed, is an event on the model with the actor it was done for.

With `export: on_register`, every newly registered version is exported by `ExportQueue`, one
thread beside the server's passes: a registration never waits for MLflow, nor fails with it.
The queue is in memory: a server that stops with exports still queued records each as failed
(`muster model export NAME@V` makes it later); one killed outright forgets them.
"""

from __future__ import annotations

import logging
import queue
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sqlalchemy import select

from muster import api
from muster.checkpoint_archive import unpack_checkpoint
from muster.config.cluster import MlflowConfig
from muster.errors import Conflict, MusterError, NotFound
from muster.home import Home
from muster.mlflow_export import (
    ExportSource,
    collect_reports,
    connect,
    plan_export,
    push,
    settled_artifacts,
)
from muster.services import artifacts, checkpoints, metrics, registry
from muster.services.access import Action, Principal, authorize
from muster.states import EventReason
from muster.store import RegisteredModel, Store, record_event

__all__ = ["ExportQueue", "export_for", "export_version", "gather"]

log = logging.getLogger(__name__)

MAX_QUEUED = 1000  # versions waiting for their export; past it, each is recorded as failed
STOP_WAIT = 10.0  # seconds the server's stop waits for an export under way
MAX_MESSAGE = 2000  # of an event's message


def export_version(store: Store, home: Home, config: MlflowConfig,
                   version: api.ModelVersionView, actor: str) -> api.MlflowExport:
    """Export `version` to `config`'s tracking server, as `actor` asked (or registered it);
    an event on the model either way.

    Raises:
        MusterError: the export failed (ExportError: MLflow's side; Conflict: the
            checkpoint or artifacts are no longer whole here); recorded first.
        OSError: its files could not be written here; recorded first.
    """
    name = config.registered_model_prefix + version["model"]
    try:
        mlflow = connect(config.tracking_uri)
        with tempfile.TemporaryDirectory(prefix=".mlflow-export-", dir=home.root) as work:
            plan = plan_export(gather(store, home, version, Path(work)), name)
            made = push(plan, mlflow)
    except (MusterError, OSError) as exc:
        _record(store, version, actor, EventReason.MODEL_EXPORT_FAILED,
                f"{_shown(version)} was not exported to MLflow at {config.tracking_uri}: {exc}")
        raise
    _record(store, version, actor, EventReason.MODEL_EXPORTED,
            f"{_shown(version)} exported to MLflow at {made['tracking_uri']}: run "
            f"{made['run_id']}, {made['registered_model']} version {made['model_version']}")
    return made


def export_for(store: Store, home: Home, config: MlflowConfig | None, who: Principal,
               ref: registry.VersionRef) -> api.MlflowExport:
    """`export_version` of the version `ref` names, asked for by `who`: one who may
    register from its trial.

    Raises:
        NotFound: no such model or version.
        Forbidden: `who` may not register from that trial.
        Conflict: the cluster config names no MLflow server.
    """
    version = registry.describe_version(store, ref)
    authorize(who, Action.REGISTER_MODEL, owner=version["lineage"].get("owner"),
              subject=f"trial {version['trial_id']}")
    if config is None:
        raise Conflict("this server's cluster config names no MLflow tracking server (`mlflow: "
                       "{tracking_uri: ...}`); export from your machine with `muster model "
                       f"export {version['model']}@{version['version']} --mlflow URL`")
    return export_version(store, home, config, version, who.name)


def gather(store: Store, home: Home, version: api.ModelVersionView, work: Path
           ) -> ExportSource:
    """What to export of `version`, from the store and the files here, into `work`."""
    trial_id = version["trial_id"]
    reports = collect_reports(
        lambda after: metrics.list_metrics(store, trial_id, after_step=after,
                                           limit=metrics.MAX_LIMIT), f"trial {trial_id}")
    checkpoint = work / "checkpoint"
    download = checkpoints.open_any_download(store, home, version["checkpoint_uuid"])
    try:
        unpack_checkpoint(download.chunks(), checkpoint, download.plan.name, trial_id)
    finally:
        download.close()
    return ExportSource(version=version, reports=reports, checkpoint_dir=checkpoint,
                        artifacts_dir=_artifacts(store, home, trial_id, work / "artifacts"))


def _artifacts(store: Store, home: Home, trial_id: int, dest: Path) -> Path | None:
    """The trial's artifact set copied into `dest`, each file's sha256 checked as it is
    read; None when it has no file."""
    found = settled_artifacts(lambda: _artifact_set(store, trial_id), trial_id)
    if found is None or not found["files"]:
        return None
    for item in found["files"]:
        target = dest.joinpath(*PurePosixPath(item["path"]).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        download = artifacts.open_artifact(store, home, trial_id, item["path"])
        with open(target, "xb") as out:
            for chunk in download.chunks():
                out.write(chunk)
    return dest


def _artifact_set(store: Store, trial_id: int) -> api.ArtifactSetView | None:
    try:
        return artifacts.trial_artifacts(store, trial_id)
    except NotFound:
        return None


def _record(store: Store, version: api.ModelVersionView, actor: str, reason: EventReason,
            message: str) -> None:
    with store.session_scope() as s:
        model_id = s.scalars(select(RegisteredModel.id)
                             .where(RegisteredModel.name == version["model"])).first()
        if model_id is None:  # deleted meanwhile: the log keeps what happened
            log.warning("model %s is gone; not recorded: %s", version["model"], message)
            return
        record_event(s, entity="model", entity_id=model_id, reason=reason, actor=actor,
                     message=message[:MAX_MESSAGE], experiment_id=version["experiment_id"],
                     trial_id=version["trial_id"])


def _shown(version: api.ModelVersionView) -> str:
    return f"{version['model']} v{version['version']}"


class ExportQueue:
    """`export: on_register`: each newly registered version exported in the background,
    one at a time, in the order registered. `submit` never waits for MLflow and never
    raises; what does not get exported is recorded as failed."""

    def __init__(self, store: Store, home: Home, config: MlflowConfig) -> None:
        self.store, self.home, self.config = store, home, config
        self._queue: queue.Queue[_Job] = queue.Queue(MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self._current: _Job | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mlflow-exports", daemon=True)
        self._thread.start()

    def submit(self, model: str, version: int, actor: str) -> None:
        """Queue model `model` v`version`, registered by `actor`, for its export."""
        job = _Job(model, version, actor)
        if self._stopped.is_set():
            self._unexported(job, "the server is stopping")
            return
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._unexported(job, f"{MAX_QUEUED} exports were already waiting")

    def stop(self) -> None:
        """Wait a while for the export under way (recorded as cut off if it is not done by
        then), and record the exports still queued as failed."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)
            current = self._current
            if self._thread.is_alive() and current is not None:
                self._unexported(current, "the server stopped during the export (its MLflow "
                                 "run may be left RUNNING)")
        while True:
            try:
                self._unexported(self._queue.get_nowait(), "the server stopped before its turn")
            except queue.Empty:
                return

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                job = self._queue.get(timeout=_POLL)
            except queue.Empty:
                continue
            self._current = job
            try:
                self._export(job)
            finally:
                self._current = None

    def _export(self, job: _Job) -> None:
        try:
            version = registry.describe_version(
                self.store, registry.VersionRef(job.model, job.version))
            export_version(self.store, self.home, self.config, version, job.actor)
        except (MusterError, OSError) as exc:  # recorded as an event by export_version
            log.warning("MLflow export of %s v%s failed: %s", job.model, job.version, exc)
        except Exception as exc:  # a bug: logged with its traceback, and recorded
            log.exception("MLflow export of %s v%s failed", job.model, job.version)
            self._unexported(job, f"muster's own error ({exc!r}); see the server's log")

    def _unexported(self, job: _Job, why: str) -> None:
        try:
            found = registry.describe_version(self.store,
                                              registry.VersionRef(job.model, job.version))
        except NotFound:
            log.warning("%s v%s was not exported to MLflow (%s), and is gone", job.model,
                        job.version, why)
            return
        _record(self.store, found, job.actor, EventReason.MODEL_EXPORT_FAILED,
                f"{_shown(found)} was not exported to MLflow at {self.config.tracking_uri}: "
                f"{why}; `muster model export {job.model}@{job.version}` exports it")


_POLL = 0.5  # seconds the export thread waits for work before it looks for a stop


@dataclass(frozen=True)
class _Job:
    model: str
    version: int
    actor: str  # who registered it
