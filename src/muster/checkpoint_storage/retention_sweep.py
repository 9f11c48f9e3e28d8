"""A retention sweep: the plan of the cluster config's `retention` (`retention.decide` over
facts read from the store, measured on disk), recorded, then carried out.

It runs in the storage worker's thread (at start, daily, and when `muster gc runs` asks),
the one thread that deletes checkpoints, so a sweep never races a collection over one; a
few trials at a time between the worker's rounds (`Sweeping.step`), so the uploads of
running trials' checkpoints never wait for a long sweep. The plan is made from what still
exists, trial by trial, and each trial's part is done before the next is read:

1. record: in one transaction, checked again that nothing came to hold its checkpoints
   since the plan was read (a version registered meanwhile: the trial is left), the
   trial's `logs_removed_at` or `files_removed_at` (only where not set yet: a second sweep
   records nothing again), its checkpoints `deleting` (with the rule as their reason) and
   its artifact sets `deleting`, and the event that names every line with its size and
   the rule;
2. remove: the checkpoints through the worker's own deletion (storage, run directory,
   cache; then `deleted` with a `checkpoint deleted` event each), the artifact sets from
   storage, then the run directory and the restart cache, or only the logs.

A failure in step 2 (storage refusing, a file that cannot be removed) is logged and left:
the next sweep's plan holds what is still there and finishes it, without a second event.
Sizes come from the rows where they were recorded (a checkpoint's and an artifact set's
files), else from walking the files without following links, bounded: a walk stops at
`MAX_FILES_COUNTED` files and says "at least".
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from muster.checkpoint_storage import transfer
from muster.checkpoint_storage.base import Backend
from muster.checkpoint_storage.location import Location
from muster.checkpoint_storage.pins import held
from muster.checkpoint_storage.retention import (
    Decision,
    Kept,
    Line,
    Rules,
    TrialFacts,
    decide,
    event_message,
    experiment_kept,
)
from muster.errors import StorageError
from muster.home import Home
from muster.rundir import RankFile, RunDir
from muster.states import (
    ArtifactState,
    CheckpointState,
    EventReason,
    ExperimentState,
    RetentionItem,
    values,
)
from muster.store import ArtifactSet, Checkpoint, Experiment, Store, Trial, record_event
from muster.store.actors import STORAGE

__all__ = ["MAX_FILES_COUNTED", "MAX_LISTED", "Retaining", "Sweep", "Sweeping", "measure_tree",
           "plan"]

log = logging.getLogger(__name__)

MAX_FILES_COUNTED = 100_000  # a walk stops here; its size is then "at least"
# Lines (and kept) an answer lists. A plan asked for stops there: measuring every run of a
# large backlog would hold a request for minutes; a sweep removes them all.
MAX_LISTED = 1000
EXPERIMENTS_PER_READ = 50
CHECKPOINTS_PER_QUERY = 500  # ids in one IN list
LOG_FILES = (RankFile.LOG, RankFile.INDEX, RankFile.DROPPED)  # what "its logs" are
# What a removal moves to `deleting`: not one being uploaded (the worker's own thread
# uploads, so none is, but a row is not taken from under a step that owns it).
_REMOVABLE = (CheckpointState.LOCAL, CheckpointState.STORED, CheckpointState.UPLOAD_FAILED)
# A row of a select of a few columns, read by their names (the selects below say which).
_Row = Any


class Retaining(Protocol):
    """What a sweep needs of the storage worker (`worker.StorageWorker`)."""

    store: Store
    home: Home

    def backend(self, location: Location) -> Backend: ...

    def delete_checkpoints(self, ids: list[int]) -> None: ...


@dataclass
class TrialPlan:
    """One trial's part of a sweep: what to remove (`lines`, all by one rule) and the rows
    and files they stand for."""

    trial_id: int
    experiment_id: int
    run: RunDir
    cache: Path
    scope: RetentionItem  # LOGS or RUN
    lines: list[Line]
    checkpoint_ids: list[int] = field(default_factory=list)
    artifact_set_ids: list[int] = field(default_factory=list)


@dataclass
class Sweep:
    """A plan or a sweep as answered: its first `MAX_LISTED` lines and kept, with totals
    over every line it went through (a plan stops after `MAX_LISTED`: not `complete`)."""

    lines: list[Line] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    total_lines: int = 0
    total_bytes: int = 0
    more_kept: int = 0
    complete: bool = True

    def add(self, part: TrialPlan | Kept) -> None:
        if isinstance(part, Kept):
            if len(self.kept) < MAX_LISTED:
                self.kept.append(part)
            else:
                self.more_kept += 1
            return
        for line in part.lines:
            self.total_lines += 1
            self.total_bytes += line.bytes
            if len(self.lines) < MAX_LISTED:
                self.lines.append(line)


def plan(worker: Retaining, rules: Rules, at: float, limit: int = MAX_LISTED) -> Sweep:
    """What a sweep at time `at` would remove, with sizes, up to about `limit` lines (then
    not `complete`); nothing is changed."""
    found = Sweep()
    for part in _parts(worker.store, worker.home, rules, at):
        if found.total_lines >= limit:
            found.complete = False
            break
        found.add(part)
    return found


class Sweeping:
    """A sweep in progress, carried out a few trials at a time (`step`) between the storage
    worker's other work: a first sweep of a large backlog removes for hours, and the
    uploads of running trials' checkpoints must not wait for it."""

    def __init__(self, worker: Retaining, rules: Rules, at: float,
                 asked_by: str | None = None) -> None:
        self.worker, self.rules, self.at, self.asked_by = worker, rules, at, asked_by
        self.done = Sweep()  # what it removed (and kept) so far
        self._parts = _parts(worker.store, worker.home, rules, at)

    def step(self, trials: int) -> bool:
        """Remove what up to `trials` trials lose, each removal recorded first; whether the
        sweep has more to do."""
        for part in self._parts:
            if isinstance(part, TrialPlan):
                if not _record(self.worker.store, part, self.rules, self.at, self.asked_by):
                    continue  # registered meanwhile: the next sweep decides again
                _remove(self.worker, part)
                trials -= 1
            self.done.add(part)
            if trials <= 0:
                return True
        return False


# -- the plan --------------------------------------------------------------------------------

@dataclass
class _Facts:
    """What one read holds of a few ended experiments' trials."""

    trials: dict[int, list[_Row]]  # experiment id -> its trials
    checkpoints: dict[int, list[_Row]]  # trial id -> its checkpoints not deleted
    holds: dict[int, str]  # checkpoint id -> what holds it
    sets: dict[int, list[_Row]]  # trial id -> its artifact sets


def _parts(store: Store, home: Home, rules: Rules, at: float) -> Iterator[TrialPlan | Kept]:
    for experiments in _ended_experiments(store, rules, at):
        with store.session_scope() as s:
            facts = _read(s, [e.id for e in experiments], rules)
        for experiment in experiments:
            kept = experiment_kept(experiment.labels or (), rules)
            if kept is not None:
                yield Kept(experiment.id, experiment.name, None, kept)
                continue
            for trial in facts.trials.get(experiment.id, []):
                yield from _trial_parts(home, experiment, trial, facts, rules, at)


def _ended_experiments(store: Store, rules: Rules, at: float) -> Iterator[list[_Row]]:
    """Experiments that ended before the youngest rule's age and are not being deleted, a
    few at a time, by id."""
    ended = values(state for state in ExperimentState if state.is_terminal())
    after = 0
    while True:
        with store.session_scope() as s:
            rows = s.execute(
                select(Experiment.id, Experiment.name, Experiment.ended_at, Experiment.labels)
                .where(Experiment.id > after, Experiment.state.in_(ended),
                       Experiment.ended_at <= at - rules.youngest,
                       Experiment.delete_requested_at.is_(None))
                .order_by(Experiment.id).limit(EXPERIMENTS_PER_READ)).all()
        if not rows:
            return
        yield list(rows)
        after = rows[-1].id


def _read(s: Session, experiment_ids: Sequence[int], rules: Rules) -> _Facts:
    trials = _grouped(s.execute(
        select(Trial.id, Trial.uuid, Trial.experiment_id, Trial.state)
        .where(Trial.experiment_id.in_(experiment_ids)).order_by(Trial.id)), "experiment_id")
    checkpoints = _grouped(s.execute(
        select(Checkpoint.id, Checkpoint.trial_id, Checkpoint.name, Checkpoint.path,
               Checkpoint.size_bytes, Checkpoint.file_count)
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id.in_(experiment_ids),
               Checkpoint.state != CheckpointState.DELETED)
        .order_by(Checkpoint.id)), "trial_id")
    ids = [row.id for rows in checkpoints.values() for row in rows]
    holds: dict[int, str] = {}
    for start in range(0, len(ids), CHECKPOINTS_PER_QUERY):
        holds.update(held(s, ids[start:start + CHECKPOINTS_PER_QUERY],
                          registered=rules.keep_registered))
    sets = _grouped(s.execute(
        select(ArtifactSet.id, ArtifactSet.trial_id, ArtifactSet.attempt, ArtifactSet.state,
               ArtifactSet.path, ArtifactSet.size_bytes, ArtifactSet.file_count,
               ArtifactSet.storage_state)
        .join(Trial, Trial.id == ArtifactSet.trial_id)
        .where(Trial.experiment_id.in_(experiment_ids))
        .order_by(ArtifactSet.id)), "trial_id")
    return _Facts(trials, checkpoints, holds, sets)


def _grouped(rows: Iterable[_Row], key: str) -> dict[int, list[_Row]]:
    """`rows` by the value of their column `key`, in their order."""
    grouped: dict[int, list[_Row]] = defaultdict(list)
    for row in rows:
        grouped[getattr(row, key)].append(row)
    return grouped


def _trial_parts(home: Home, experiment: _Row, trial: _Row, facts: _Facts,
                 rules: Rules, at: float) -> Iterator[TrialPlan | Kept]:
    checkpoints = facts.checkpoints.get(trial.id, [])
    sets = facts.sets.get(trial.id, [])
    decision = decide(TrialFacts(
        trial.id, experiment.ended_at, trial.state,
        holds=tuple(f"checkpoint {c.name}: {facts.holds[c.id]}" for c in checkpoints
                    if c.id in facts.holds),
        artifacts_pending=any(a.state is ArtifactState.PENDING for a in sets)), rules, at)
    if decision is None:
        return
    if decision.kept is not None:
        yield Kept(experiment.id, experiment.name, trial.id, decision.kept)
    if decision.scope is None:
        return
    part = TrialPlan(trial.id, experiment.id, home.run_dir(trial.uuid),
                     home.checkpoint_cache_dir / trial.uuid, decision.scope, [])
    line = _Liner(experiment, trial.id, decision)
    if decision.scope is RetentionItem.LOGS:
        _plan_logs(part, line)
    else:
        _plan_run(part, line, checkpoints, sets)
    if part.lines:
        yield part


@dataclass(frozen=True)
class _Liner:
    """Makes the lines of one trial's decision."""

    experiment: _Row
    trial_id: int
    decision: Decision

    def __call__(self, what: RetentionItem, name: str | None, size: int, files: int,
                 at_least: bool = False) -> Line:
        return Line(what, self.experiment.id, self.experiment.name, self.trial_id, name,
                    size, files, at_least, self.experiment.ended_at, self.decision.rule)


def _plan_logs(part: TrialPlan, line: _Liner) -> None:
    files = list(_log_files(part.run))
    if files:
        part.lines.append(line(RetentionItem.LOGS, None, sum(size for _, size in files),
                               len(files)))


def _log_files(run: RunDir) -> Iterator[tuple[Path, int]]:
    """Every replica log (and its index and dropped ranges) of every attempt, with sizes."""
    for number in run.attempt_numbers():
        attempt = run.attempt(number)
        for kind in LOG_FILES:
            for _, path in attempt.ranks_with(kind):
                try:
                    yield path, path.lstat().st_size
                except FileNotFoundError:
                    continue  # removed meanwhile: nothing of it to count


def _plan_run(part: TrialPlan, line: _Liner, checkpoints: Sequence[_Row],
              sets: Sequence[_Row]) -> None:
    apart: set[str] = set()  # listed on lines of their own: not counted in the run's
    for c in checkpoints:
        part.checkpoint_ids.append(c.id)
        part.lines.append(line(RetentionItem.CHECKPOINT, c.name, c.size_bytes, c.file_count))
        apart.add(os.path.normpath(c.path))
    for a in sets:
        kept_somewhere = (a.storage_state is not CheckpointState.DELETED
                          or (a.path is not None and os.path.isdir(a.path)))
        if a.state is ArtifactState.COLLECTED and kept_somewhere:
            part.artifact_set_ids.append(a.id)
            part.lines.append(line(RetentionItem.ARTIFACTS, f"attempt {a.attempt}",
                                   a.size_bytes, a.file_count))
            if a.path is not None:
                apart.add(os.path.normpath(a.path))
    roots = [p for p in (part.run.path, part.cache) if os.path.lexists(p)]
    if roots:
        size, files, at_least = measure_tree(roots, apart)
        part.lines.insert(0, line(RetentionItem.RUN, None, size, files, at_least))


def measure_tree(roots: Sequence[Path], skip: Collection[str] = (),
                 limit: int = MAX_FILES_COUNTED) -> tuple[int, int, bool]:
    """(bytes, files, stopped early) under `roots`: links are counted, never followed;
    directories in `skip` (normalised paths) are left out; the walk stops at `limit`
    files."""
    stack = [os.fspath(root) for root in roots]
    size = files = 0
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone meanwhile, or a root that is a file (counted below: not here)
        except OSError as exc:
            log.warning("retention: cannot measure %s: %s", exc.filename, exc)
            continue
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if os.path.normpath(entry.path) not in skip:
                        stack.append(entry.path)
                    continue
                files += 1
                try:
                    size += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue  # removed meanwhile: counted as a file of no bytes
                if files >= limit:
                    return size, files, True
    return size, files, False


# -- recording, then removing -----------------------------------------------------------------

def _record(store: Store, part: TrialPlan, rules: Rules, at: float,
            asked_by: str | None) -> bool:
    """Commit the trial's removal before any of it happens (see the module's docstring);
    False, recording nothing, when something came to hold one of its checkpoints since
    the plan was read (a version registered meanwhile: checked again in this transaction,
    as GC's `_record_plan` does)."""
    run = part.scope is RetentionItem.RUN
    with store.session_scope() as s:
        if run and held(s, part.checkpoint_ids, registered=rules.keep_registered):
            return False
        first = _stamp(s, part.trial_id, Trial.files_removed_at if run else Trial.logs_removed_at,
                       at)
        if run:
            _stamp(s, part.trial_id, Trial.logs_removed_at, at)
            reason = f"retention: {event_message(part.lines)}"
            s.execute(update(Checkpoint).where(Checkpoint.id.in_(part.checkpoint_ids),
                                               Checkpoint.state.in_(_REMOVABLE))
                      .values(state=CheckpointState.DELETING, gc_reason=reason))
            s.execute(update(ArtifactSet).where(ArtifactSet.id.in_(part.artifact_set_ids),
                                                ArtifactSet.storage_state.in_(_REMOVABLE))
                      .values(storage_state=CheckpointState.DELETING))
        if first:
            asked = f"; asked for by {asked_by}" if asked_by else ""
            record_event(s, entity="trial", entity_id=part.trial_id,
                         reason=EventReason.RUN_REMOVED if run else EventReason.LOGS_REMOVED,
                         actor=STORAGE, trial_id=part.trial_id,
                         experiment_id=part.experiment_id,
                         message=event_message(part.lines) + asked)
    return True


def _stamp(s: Session, trial_id: int, column: Any, at: float) -> bool:
    """Set the trial's `column` to `at` unless it is set; whether this did."""
    result = cast(CursorResult[Any], s.execute(  # an UPDATE's result: it has a rowcount
        update(Trial).where(Trial.id == trial_id, column.is_(None)).values({column: at})))
    return result.rowcount == 1


def _remove(worker: Retaining, part: TrialPlan) -> None:
    if part.scope is RetentionItem.LOGS:
        for path, _ in _log_files(part.run):
            _removed(path.unlink, path)
        return
    with worker.store.session_scope() as s:
        doomed = list(s.scalars(select(Checkpoint.id).where(
            Checkpoint.id.in_(part.checkpoint_ids),
            Checkpoint.state == CheckpointState.DELETING)))
    worker.delete_checkpoints(doomed)
    _delete_artifact_sets(worker, part.artifact_set_ids)
    for path in (part.run.path, part.cache):
        _removed(functools.partial(shutil.rmtree, path), path)


def _removed(remove: Callable[[], object], path: Path) -> None:
    """Remove `path`; a failure is logged and left to the next sweep."""
    try:
        remove()
    except FileNotFoundError:
        return  # gone already: done
    except OSError as exc:
        log.warning("retention: %s not removed, tried again by the next sweep: %s", path, exc)


def _delete_artifact_sets(worker: Retaining, set_ids: Sequence[int]) -> None:
    """Remove the trial's artifact sets recorded `deleting` from storage (where one was
    uploaded), then record them `deleted`; their run directory copies go with the run
    directory."""
    with worker.store.session_scope() as s:
        doomed = s.execute(select(ArtifactSet.id, ArtifactSet.uuid, ArtifactSet.storage).where(
            ArtifactSet.id.in_(set_ids),
            ArtifactSet.storage_state == CheckpointState.DELETING)).all()
    for set_id, uuid, storage in doomed:
        try:
            if storage is not None:
                transfer.delete_checkpoint(worker.backend(Location.from_json(storage)), uuid)
        except StorageError as exc:
            log.warning("artifact set %d: deletion not finished, tried again by the next "
                        "sweep: %s", set_id, exc.for_log())
            continue
        with worker.store.session_scope() as s:
            s.get_one(ArtifactSet, set_id).storage_state = CheckpointState.DELETED
