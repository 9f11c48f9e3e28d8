"""The server's checkpoint storage worker: uploads, garbage collection, deletions, sweeps,
and the cluster config's retention (`retention_sweep`: at start, daily, and when asked).

A sweep also removes, from the run directories, the checkpoint saves in progress that no
process writes into any more (`checkpoint_files.abandoned`: their attempt ended, or every
rank of a sharded save finished with it) once nothing in them changed for
`abandoned_save_age` seconds; a save that may still be written is never touched.

One thread beside the supervisor's passes, so a slow bucket never delays a trial's
supervision. Its work is in the store, not in memory: a checkpoint to upload is a row in
state `local` (or `upload_failed` whose next try is due), a deletion decided is a row in
state `deleting`, an experiment to delete has `delete_requested_at`. So a server killed at
any moment loses nothing: at start `recover()` turns the uploads it was doing back into
`local` (redone; a metadata.json already in storage is recognised), and the deletions it
had decided are finished. Wake-ups (`request_gc`) go through a bounded queue; when it is
full, the next round collects every experiment instead.

Every state change is committed before the storage operation it leads to: `uploading`
before the first byte, `deleting` before the first object is removed, and `deleted` only
after storage confirmed nothing is left.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from muster import checkpoint_files
from muster.checkpoint_storage import artifact_sets, retention_sweep, transfer
from muster.checkpoint_storage.base import Backend
from muster.checkpoint_storage.location import (
    Location,
    effective_location,
    effective_policy,
    open_backend,
)
from muster.checkpoint_storage.metrics import checkpoint_metrics
from muster.checkpoint_storage.pins import held
from muster.checkpoint_storage.planner import DELETION_BEGUN, CheckpointFacts, Decision, plan
from muster.checkpoint_storage.retention import Rules
from muster.checkpoint_storage.sweep import SweepReport, sweep_location
from muster.checkpoint_storage.transfer import retry_delay
from muster.config.cluster import RetentionConfig
from muster.config.schema import CheckpointStorageConfig
from muster.errors import MusterError, StorageError
from muster.home import Home
from muster.states import AttemptState, CheckpointState, EventReason
from muster.store import (
    Attempt,
    Checkpoint,
    Experiment,
    ModelVersion,
    RegisteredModel,
    Store,
    Trial,
    record_event,
)
from muster.store.actors import STORAGE
from muster.store.configs import experiment_config
from muster.store.models import now

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["PlannedCheckpoint", "StorageWorker"]

UPLOADS_PER_ROUND = 4
BATCH = 500  # checkpoints read, decided or recorded deleted per transaction
GC_QUEUE_SIZE = 1024
IDLE_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
ORPHAN_AGE_SECONDS = 3600.0  # a prefix without metadata.json this old is an abandoned upload
SWEEP_EVERY_SECONDS = 600.0
RETENTION_EVERY_SECONDS = 86400.0  # the cluster config's retention: daily (and at start)
RETENTION_TRIALS_PER_ROUND = 20  # a sweep goes on between rounds of uploads, this many at a time
# A save in progress that no process can write into any more goes once nothing in it changed
# for this long (a replica LOST on a machine that still runs may yet write into it).
ABANDONED_SAVE_AGE_SECONDS = 600.0
# Trials ended longer ago than this are not looked at again: a sweep since then tidied them.
ABANDONED_SAVE_LOOKBACK_SECONDS = 86400.0


@dataclass(frozen=True)
class Doomed:
    """A checkpoint being deleted, as read once for its deletion."""

    id: int
    uuid: str
    storage: dict[str, Any] | None
    path: Path
    name: str
    step: int
    trial_id: int
    experiment_id: int
    reason: str
    cached: Path  # a copy fetched back for a restart, if any


@dataclass(frozen=True)
class PlannedCheckpoint:
    """One checkpoint in a GC plan, as `muster checkpoint gc` prints it."""

    id: int
    trial_id: int
    name: str
    step: int
    state: CheckpointState
    keep: bool
    reasons: tuple[str, ...]


@dataclass
class StorageWorker:
    store: Store
    home: Home
    default: CheckpointStorageConfig | None = None  # the cluster config's checkpoint_storage
    orphan_age: float = ORPHAN_AGE_SECONDS
    abandoned_save_age: float = ABANDONED_SAVE_AGE_SECONDS
    environ: dict[str, str] | None = None  # where `env:` keys are read (default: os.environ)
    retention: RetentionConfig | None = None  # the cluster config's `retention`
    _gc: queue.Queue[int] = field(default_factory=lambda: queue.Queue(GC_QUEUE_SIZE))
    _gc_everything: bool = False
    _backends: dict[str, Backend] = field(default_factory=dict)
    _busy: set[str] = field(default_factory=set)  # uuids being uploaded now
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wake: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last_sweep: float = 0.0
    _failures: int = 0  # rounds that failed in a row
    _ends_seen_until: float = field(default_factory=now)  # trials and experiments ended since
    _next_retention: float = 0.0  # when the next retention sweep is due (0: at start)
    _retention_asked: threading.Event = field(default_factory=threading.Event)
    _retention_asked_by: str | None = None  # who asked for the sweep asked for
    _sweeping: retention_sweep.Sweeping | None = None  # a retention sweep under way

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="muster-storage", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for backend in self._backends.values():
            backend.close()

    def request_gc(self, experiment_id: int) -> None:
        """Collect this experiment's checkpoints soon (its trial ended, a checkpoint was
        stored). Never blocks: a full queue makes the next round collect every one."""
        try:
            self._gc.put_nowait(experiment_id)
        except queue.Full:
            self._gc_everything = True
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def request_retention(self, asked_by: str) -> None:
        """Apply the cluster config's retention now, in the worker's thread (`muster gc
        runs`); its events say who asked."""
        self._retention_asked_by = asked_by
        self._retention_asked.set()
        self._wake.set()

    def _run(self) -> None:
        self._guarded(self.recover, "recovering unfinished uploads and deletions")
        while not self._stop.is_set():
            worked = self._guarded(self.run_once, "a round of uploads and collection")
            if time.time() - self._last_sweep > SWEEP_EVERY_SECONDS:
                self._last_sweep = time.time()
                self._guarded(self.sweep, "sweeping storage for orphans")
            worked = self._guarded(self._retain_some,
                                   "applying the cluster config's retention") or worked
            if not worked:
                self._wake.wait(IDLE_SECONDS)
                self._wake.clear()

    def _guarded(self, work: Callable[[], Any], what: str) -> Any:
        """`work()`, or False after logging its failure; failures in a row back off (up to
        a minute) and are logged sparingly (the 1st, 2nd, 5th, then every 60th)."""
        try:
            result = work()
        except MusterError as exc:
            shown = exc.for_log() if isinstance(exc, StorageError) else str(exc)
            self._failed(f"{what} failed: {shown}", with_traceback=False)
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; retried
            self._failed(f"{what} failed unexpectedly: {type(exc).__name__}: {exc}",
                         with_traceback=True)
        else:
            self._failures = 0
            return result
        self._stop.wait(min(MAX_BACKOFF_SECONDS, IDLE_SECONDS * 2 ** min(self._failures, 6)))
        return False

    def _failed(self, message: str, with_traceback: bool) -> None:
        self._failures += 1
        if self._failures in (1, 2, 5) or self._failures % 60 == 0:
            log.error("checkpoint storage: %s (%d in a row)", message, self._failures,
                      exc_info=with_traceback)

    # -- one round -------------------------------------------------------------------------

    def recover(self) -> None:
        """After a restart: uploads cut short are redone, every experiment with checkpoints
        is collected (deletions decided and not done are finished)."""
        with self.store.session_scope() as s:
            for row in s.scalars(select(Checkpoint).where(
                    Checkpoint.state == CheckpointState.UPLOADING)):
                row.state = CheckpointState.LOCAL
        artifact_sets.recover(self.store)
        self._gc_everything = True

    def run_once(self) -> bool:
        """Upload what is due, delete experiments asked to be, collect those asked for.
        Returns whether anything was done."""
        worked = self._upload_due()
        worked = artifact_sets.collect_pending(self.store, self.home, UPLOADS_PER_ROUND) or worked
        worked = artifact_sets.upload_due(self, UPLOADS_PER_ROUND) or worked
        worked = self._delete_requested_experiments() or worked
        for experiment_id in self._experiments_to_collect():
            planned = self.collect(experiment_id)
            worked = worked or any(not p.keep for p in planned)
        return worked

    # -- uploads ---------------------------------------------------------------------------

    def _upload_due(self) -> bool:
        claimed = self._claim_uploads(UPLOADS_PER_ROUND)
        for checkpoint_id, location, path, uuid, trial_id in claimed:
            self._upload(checkpoint_id, location, Path(path), uuid, trial_id)
        return bool(claimed)

    def _claim_uploads(self, limit: int) -> list[tuple[int, Location, str, str, int]]:
        """Mark up to `limit` due uploads `uploading`, with the storage each goes to."""
        at = now()
        with self.store.session_scope() as s:
            rows = s.execute(
                select(Checkpoint, Experiment).join(Trial, Trial.id == Checkpoint.trial_id)
                .join(Experiment, Experiment.id == Trial.experiment_id)
                .where(Checkpoint.intact.is_(True),
                       Experiment.delete_requested_at.is_(None),
                       (Checkpoint.state == CheckpointState.LOCAL)
                       | ((Checkpoint.state == CheckpointState.UPLOAD_FAILED)
                          & (Checkpoint.next_try_at <= at)))
                .order_by(Checkpoint.id).limit(limit)).all()
            claimed = []
            for row, experiment in rows:
                location = (Location.from_json(row.storage) if row.storage else
                            self.location_of(experiment))
                row.state, row.storage = CheckpointState.UPLOADING, location.to_json()
                claimed.append((row.id, location, row.path, row.uuid, row.trial_id))
            return claimed

    def location_of(self, experiment: Experiment) -> Location:
        config = experiment_config(experiment).checkpoint_storage
        return effective_location(config, self.default, self.home)

    def _upload(self, checkpoint_id: int, location: Location, path: Path, uuid: str,
                trial_id: int) -> None:
        try:
            with self.uploading(uuid):
                transfer.upload_checkpoint(self.backend(location), path, uuid, trial_id)
        except StorageError as exc:
            self._upload_failed(checkpoint_id, location, exc)
        else:
            self._stored(checkpoint_id)

    @contextlib.contextmanager
    def uploading(self, uuid: str) -> Iterator[None]:
        """While `<uuid>/` is being written: the sweep leaves it alone."""
        with self._lock:
            self._busy.add(uuid)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(uuid)

    def _stored(self, checkpoint_id: int) -> None:
        with self.store.session_scope() as s:
            row = s.get_one(Checkpoint, checkpoint_id)
            if row.state is not CheckpointState.UPLOADING:
                return  # decided otherwise meanwhile (deleted with its experiment)
            row.state, row.stored_at, row.error, row.next_try_at = (
                CheckpointState.STORED, now(), None, None)
            experiment_id = s.get_one(Trial, row.trial_id).experiment_id
        self.request_gc(experiment_id)

    def _upload_failed(self, checkpoint_id: int, location: Location, exc: StorageError) -> None:
        retry = not isinstance(exc, transfer.CheckpointChanged)
        with self.store.session_scope() as s:
            row = s.get_one(Checkpoint, checkpoint_id)
            row.upload_tries += 1
            delay = retry_delay(row.upload_tries)
            row.state, row.error = CheckpointState.UPLOAD_FAILED, str(exc)
            row.next_try_at = now() + delay if retry else None
            then = (f"tried again in {delay:.0f} s" if retry
                    else "not tried again: the local copy is no longer what was registered")
            record_event(s, entity="trial", entity_id=row.trial_id,
                         reason=EventReason.CHECKPOINT_UPLOAD_FAILED, actor=STORAGE,
                         trial_id=row.trial_id,
                         experiment_id=s.get_one(Trial, row.trial_id).experiment_id,
                         message=f"uploading checkpoint {row.name} to {location.url()} failed "
                                 f"(try {row.upload_tries}): {exc}; {then}")
        log.warning("checkpoint %d: upload to %s failed: %s", checkpoint_id, location.url(),
                    exc.for_log())

    def backend(self, location: Location) -> Backend:
        """The backend for `location`, opened once and shared by every thread."""
        key = repr(sorted(location.to_json().items()))
        with self._lock:
            if key not in self._backends:
                self._backends[key] = open_backend(location, self.home.root, self.environ)
            return self._backends[key]

    # -- garbage collection ----------------------------------------------------------------

    def _experiments_to_collect(self) -> list[int]:
        ids = self._ended_since_last_look()
        if self._gc_everything:
            self._gc_everything = False
            with self.store.session_scope() as s:
                ids.update(s.scalars(select(Trial.experiment_id).join(
                    Checkpoint, Checkpoint.trial_id == Trial.id).where(
                    Checkpoint.state != CheckpointState.DELETED).distinct()))
        while True:
            try:
                ids.add(self._gc.get_nowait())
            except queue.Empty:
                return sorted(ids)

    def _ended_since_last_look(self) -> set[int]:
        """Experiments one of whose trials, or which, ended since the last look: GC runs
        again when a trial ends (its latest checkpoint is no longer protected)."""
        with self.store.session_scope() as s:
            since, self._ends_seen_until = self._ends_seen_until, now()
            ids = set(s.scalars(select(Trial.experiment_id).where(Trial.ended_at > since - 1)))
            ids.update(s.scalars(select(Experiment.id).where(Experiment.ended_at > since - 1)))
        return ids

    def plan_for(self, experiment_id: int,
                 override: dict[str, int] | None = None) -> list[PlannedCheckpoint]:
        """The GC plan of an experiment under its policy (or `override`'s counts)."""
        with self.store.session_scope() as s:
            experiment = s.get_one(Experiment, experiment_id)
            config = experiment_config(experiment)
            policy = effective_policy(config.checkpoint_storage, self.default,
                                      override or experiment.gc_policy)
            rows = _live_checkpoints(s, experiment_id)
            trials = {t.id: t for t in s.scalars(select(Trial).where(
                Trial.experiment_id == experiment_id))}
            metrics = checkpoint_metrics(s, rows, config.searcher.metric)
            facts = [_facts(row, metrics.get(row.id)) for row in rows]
            may_run = {t.id for t in trials.values() if not t.state.is_terminal()}
            decisions = plan(facts, may_run, policy, config.searcher.smaller_is_better)
            pins = held(s, [row.id for row in rows])
            decisions = [_pinned(d, pins[d.checkpoint_id]) if d.checkpoint_id in pins else d
                         for d in decisions]
            by_id = {row.id: row for row in rows}
            return [_planned(by_id[d.checkpoint_id], d) for d in decisions]

    def collect(self, experiment_id: int) -> list[PlannedCheckpoint]:
        """Apply the experiment's GC plan: note why each checkpoint is kept, record the
        deletions, then carry them out. Idempotent."""
        planned = self.plan_for(experiment_id)
        self.delete_checkpoints(self._record_plan(planned))
        self._drop_cache_of_ended_trials(experiment_id)
        return planned

    def _record_plan(self, planned: list[PlannedCheckpoint]) -> list[int]:
        """Commit the plan's decisions (a deletion becomes `deleting` before anything is
        removed; a reason is written only when it changed); the ids to delete."""
        doomed = []
        for chunk in _chunks(planned, BATCH):
            with self.store.session_scope() as s:
                rows = {r.id: r for r in s.scalars(select(Checkpoint).where(
                    Checkpoint.id.in_([p.id for p in chunk])))}
                pinned = held(s, list(rows))  # (held since the plan was made)
                for p in chunk:
                    row = rows.get(p.id)
                    if row is None or row.state != p.state or (not p.keep and p.id in pinned):
                        continue  # it moved since the plan was made: the next plan decides
                    reason = "; ".join(p.reasons) if p.keep else p.reasons[0]
                    if not p.keep:
                        row.state = CheckpointState.DELETING
                        doomed.append(p.id)
                    # A deletion begun keeps the reason it was begun for (GC's or retention's).
                    if row.gc_reason != reason and reason != DELETION_BEGUN:
                        row.gc_reason = reason
        return doomed

    def delete_checkpoints(self, ids: list[int]) -> None:
        """Remove `deleting` checkpoints from storage and their run directories, then record
        them `deleted` with an event each, a batch at a time. One whose removal fails stays
        `deleting` and is finished by a later collection."""
        for chunk in _chunks(ids, BATCH):
            done = [d for d in self._doomed(chunk) if self._removed(d)]
            if done:
                self._deleted(done)

    def _doomed(self, ids: Sequence[int]) -> list[Doomed]:
        with self.store.session_scope() as s:
            found = s.execute(select(Checkpoint, Trial.uuid, Trial.experiment_id).join(
                Trial, Trial.id == Checkpoint.trial_id).where(Checkpoint.id.in_(ids)))
            return [Doomed(row.id, row.uuid, row.storage, Path(row.path), row.name, row.step,
                           row.trial_id, experiment_id, row.gc_reason or "",
                           self.home.checkpoint_cache_dir / trial_uuid / row.name)
                    for row, trial_uuid, experiment_id in found]

    def _removed(self, doomed: Doomed) -> bool:
        try:
            if doomed.storage is not None:
                transfer.delete_checkpoint(self.backend(Location.from_json(doomed.storage)),
                                           doomed.uuid)
            _remove_local(doomed.path, doomed.name)
            _remove_local(doomed.cached, doomed.name)
        except (StorageError, OSError) as exc:
            log.warning("checkpoint %d: deletion not finished, tried again later: %s",
                        doomed.id, exc.for_log() if isinstance(exc, StorageError) else exc)
            return False
        return True

    def _deleted(self, done: list[Doomed]) -> None:
        at = now()
        with self.store.session_scope() as s:
            for row in s.scalars(select(Checkpoint).where(
                    Checkpoint.id.in_([d.id for d in done]))):
                row.state, row.deleted_at = CheckpointState.DELETED, at
            for d in done:
                where = (f"from {Location.from_json(d.storage).url(d.uuid)} and "
                         if d.storage else "from ")
                record_event(s, entity="trial", entity_id=d.trial_id,
                             reason=EventReason.CHECKPOINT_DELETED, actor=STORAGE,
                             trial_id=d.trial_id, experiment_id=d.experiment_id,
                             message=f"checkpoint {d.name} (step {d.step}) deleted {where}the "
                                     f"run directory: {d.reason}")

    def _drop_cache_of_ended_trials(self, experiment_id: int) -> None:
        """Copies fetched back for a restart are not needed once the trial ended."""
        with self.store.session_scope() as s:
            ended = [t.uuid for t in s.scalars(select(Trial).where(
                Trial.experiment_id == experiment_id)) if t.state.is_terminal()]
        for trial_uuid in ended:
            shutil.rmtree(self.home.checkpoint_cache_dir / trial_uuid, ignore_errors=True)

    # -- experiment deletion ---------------------------------------------------------------

    def _delete_requested_experiments(self) -> bool:
        with self.store.session_scope() as s:
            ids = list(s.scalars(select(Experiment.id).where(
                Experiment.delete_requested_at.is_not(None)).order_by(Experiment.id)))
        for experiment_id in ids:
            self.delete_experiment_now(experiment_id)
        return bool(ids)

    def delete_experiment_now(self, experiment_id: int) -> bool:
        """Remove a deleted experiment's checkpoints (storage and local), run directories,
        context and rows. False (to be tried again) while storage refuses a deletion.
        A model version registered from it after the deletion was asked for (a race the
        request's own check cannot close) cancels the deletion, with an event: the registry
        holds what it names."""
        with self.store.session_scope() as s:
            held = [f"{name} v{version}" for name, version in s.execute(
                select(RegisteredModel.name, ModelVersion.version)
                .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
                .where(ModelVersion.experiment_id == experiment_id))]
            if held:
                s.get_one(Experiment, experiment_id).delete_requested_at = None
                record_event(s, entity="experiment", entity_id=experiment_id,
                             reason=EventReason.DELETE_REQUESTED, actor=STORAGE,
                             experiment_id=experiment_id,
                             message=f"the deletion of experiment {experiment_id} was called "
                                     f"off: model versions hold its checkpoints "
                                     f"({', '.join(held)})")
                return True
            for row in _live_checkpoints(s, experiment_id):
                if row.state is not CheckpointState.DELETING:
                    row.state, row.gc_reason = (CheckpointState.DELETING,
                                                "its experiment was deleted")
            doomed = [r.id for r in _live_checkpoints(s, experiment_id)]
        self.delete_checkpoints(doomed)
        if not artifact_sets.delete_stored(self, experiment_id):
            return False
        with self.store.session_scope() as s:
            if _live_checkpoints(s, experiment_id):
                return False
            experiment = s.get_one(Experiment, experiment_id)
            self._remove_files(experiment)
            name = experiment.name
            s.delete(experiment)
            record_event(s, entity="experiment", entity_id=experiment_id,
                         reason=EventReason.EXPERIMENT_DELETED, actor=STORAGE,
                         experiment_id=experiment_id,
                         message=f"experiment {experiment_id} ({name}) deleted: its run "
                                 "directories, logs, checkpoints and records are gone")
        return True

    def _remove_files(self, experiment: Experiment) -> None:
        for trial in experiment.trials:
            shutil.rmtree(self.home.runs_dir / trial.uuid, ignore_errors=True)
            shutil.rmtree(self.home.checkpoint_cache_dir / trial.uuid, ignore_errors=True)
        shutil.rmtree(self.home.experiments_dir / experiment.uuid, ignore_errors=True)
        self.home.secrets_file(experiment.uuid).unlink(missing_ok=True)

    # -- retention -------------------------------------------------------------------------

    def retention_plan(self, at: float | None = None) -> retention_sweep.Sweep | None:
        """What the cluster config's retention would remove now (or at `at`), with sizes;
        None when it has none. Reads only: any thread may ask."""
        rules = Rules.of(self.retention)
        return None if rules is None else retention_sweep.plan(self, rules, at or now())

    def retain(self, at: float | None = None) -> retention_sweep.Sweep | None:
        """Apply the cluster config's retention now (or as at `at`), to the end: each
        removal recorded, then done (`retention_sweep`); what it removed and kept, None when
        it has none. The worker's own thread goes a few trials a round (`_retain_some`);
        this is for a test, with the thread not started."""
        sweeping = self._begin_retention(at)
        if sweeping is None:
            return None
        while sweeping.step(RETENTION_TRIALS_PER_ROUND):
            pass
        return sweeping.done

    def _retain_some(self) -> bool:
        """Go on with the retention sweep under way, `RETENTION_TRIALS_PER_ROUND` trials a
        round, or begin one when it is due (at start, then daily) or asked for; whether it
        has more to do."""
        if self._sweeping is None:
            if not (self._retention_asked.is_set() or time.time() >= self._next_retention):
                return False
            self._retention_asked.clear()
            self._next_retention = time.time() + RETENTION_EVERY_SECONDS
            self._sweeping = self._begin_retention()
        if self._sweeping is not None and self._sweeping.step(RETENTION_TRIALS_PER_ROUND):
            return True
        self._sweeping = None
        return False

    def _begin_retention(self, at: float | None = None) -> retention_sweep.Sweeping | None:
        rules = Rules.of(self.retention)
        if rules is None:
            return None
        asked_by, self._retention_asked_by = self._retention_asked_by, None
        return retention_sweep.Sweeping(self, rules, at or now(), asked_by)

    # -- orphans ---------------------------------------------------------------------------

    def sweep(self, older_than: float | None = None) -> SweepReport:
        """Delete what storage holds that no checkpoint references: prefixes without a
        metadata.json (uploads that never finished) and open multipart uploads older than
        `older_than` seconds (default `orphan_age`), and leftovers of deleted checkpoints."""
        age = self.orphan_age if older_than is None else older_than
        with self.store.session_scope() as s:
            states = {uuid: state for uuid, state in s.execute(
                select(Checkpoint.uuid, Checkpoint.state))}
            places = {repr(sorted(d.items())): d for d in s.scalars(
                select(Checkpoint.storage).where(Checkpoint.storage.is_not(None)))
                if d is not None}
        locations = [Location.from_json(d) for d in places.values()]
        if self.default is not None and self.default.type is not None:
            locations.append(effective_location(CheckpointStorageConfig(), self.default,
                                                self.home))
        report = SweepReport()
        for location in {loc.url(): loc for loc in locations}.values():
            with self._lock:
                busy = set(self._busy)
            report += sweep_location(self.backend(location), states, busy, age, now())
        report.saves_removed = self.remove_abandoned_saves()
        return report

    def remove_abandoned_saves(self) -> int:
        """Remove the saves in progress of trials that run or ended lately that nobody writes
        into any more (see the module's docstring); how many were removed."""
        with self.store.session_scope() as s:
            rows = s.execute(select(Trial.uuid, Attempt.number, Attempt.state)
                             .join(Attempt, Attempt.trial_id == Trial.id)
                             .where(or_(Trial.ended_at.is_(None), Trial.ended_at
                                        > now() - ABANDONED_SAVE_LOOKBACK_SECONDS))).all()
        attempts: dict[str, tuple[int, set[int]]] = {}
        for uuid, number, state in rows:
            latest, live = attempts.get(uuid, (number, set()))
            attempts[uuid] = (max(latest, number),
                              live | ({number} if state in AttemptState.live() else set()))
        removed = 0
        for uuid, (latest, live) in sorted(attempts.items()):
            folder = self.home.run_dir(uuid).checkpoints
            try:
                gone = checkpoint_files.remove_abandoned(folder, latest, live,
                                                         idle_for=self.abandoned_save_age)
            except OSError as exc:  # one unreadable run directory: the others go on
                log.warning("cannot look for abandoned checkpoint saves in %s: %s", folder, exc)
                continue
            for path in gone:
                log.info("removed %s: a checkpoint save nobody writes into any more", path)
            removed += len(gone)
        return removed


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _pinned(decision: Decision, why: str) -> Decision:
    """`decision` kept because something holds its checkpoint (`pins.held`)."""
    kept = decision.reasons if decision.keep else ()
    return Decision(decision.checkpoint_id, True, (why, *kept))


def _live_checkpoints(s: Session, experiment_id: int) -> list[Checkpoint]:
    return list(s.scalars(select(Checkpoint).join(Trial, Trial.id == Checkpoint.trial_id)
                          .where(Trial.experiment_id == experiment_id,
                                 Checkpoint.state != CheckpointState.DELETED)
                          .order_by(Checkpoint.id)))


def _facts(row: Checkpoint, metric: tuple[float, int] | None) -> CheckpointFacts:
    return CheckpointFacts(
        id=row.id, trial_id=row.trial_id,
        order=(row.step, row.created_at or 0.0, row.name), intact=row.intact,
        state=row.state, metric=metric[0] if metric else None,
        metric_step=metric[1] if metric else None)


def _planned(row: Checkpoint, decision: Decision) -> PlannedCheckpoint:
    return PlannedCheckpoint(id=row.id, trial_id=row.trial_id, name=row.name, step=row.step,
                             state=row.state, keep=decision.keep, reasons=decision.reasons)


def _remove_local(path: Path, name: str) -> None:
    """Remove a checkpoint directory; only one named as registered (never another path)."""
    if path.name != name:
        raise OSError(f"{path} is not checkpoint {name}; it is left alone")
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return  # gone already: done
