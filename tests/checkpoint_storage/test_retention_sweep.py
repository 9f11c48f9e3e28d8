"""A retention sweep on real trials (real processes, the real store on SQLite and
PostgreSQL, real files): the plan with sizes removes nothing; a sweep killed after it
recorded its removals has removed nothing yet and readers already say why; the next sweep
removes old runs (run directory, checkpoints in storage and on disk, artifacts) and a held
trial's logs only, without recording anything twice; a registered version's checkpoint, a
labelled experiment and a live trial are untouched."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.checkpoint_files import METADATA_FILE
from muster.checkpoint_storage import retention_sweep
from muster.checkpoint_storage.retention import Rules
from muster.checkpoint_storage.worker import StorageWorker
from muster.config.cluster import RetentionConfig
from muster.errors import Gone
from muster.home import Home
from muster.rundir import RankFile
from muster.services import artifacts, checkpoints, logs, registry, retention
from muster.services.access import Principal
from muster.services.experiments import create_experiment
from muster.states import CheckpointState, RetentionItem, Role, TrialState
from muster.store import ArtifactSet, Checkpoint, Event, Store, Trial
from tests.supervise.conftest import Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(180)]

# Two checkpoints and an artifact: every kind of file retention removes.
SCRIPT = (Path(__file__).resolve().parents[1] / "fixtures" / "checkpointed_run.py").read_text()
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


def _submit(rig: Rig, tmp_path: Path, name: str, script: str, **extra: Any) -> tuple[int, int]:
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    config = {"name": name, "entrypoint": [sys.executable, str(path)], "harness": True,
              "searcher": {"name": "single", "metric": "val_loss", "max_length": 2},
              "artifacts": ["model.pt"], "failure_policy": {"stop_grace": 1.0},
              "checkpoint_storage": {"type": "shared_fs", "path": str(tmp_path / "storage")},
              **extra}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return experiment_id, trial_id


def _drain(worker: StorageWorker) -> None:
    for _ in range(50):
        if not worker.run_once():
            return
    raise AssertionError("the storage worker still had work after 50 rounds")


def _tree(path: Path) -> dict[str, str]:
    """Every file under `path` with its sha256: what "untouched" compares. A live replica's
    activity stamp is rewritten by its shim whenever the process uses CPU, so it is named
    but not hashed."""
    return {str(p.relative_to(path)): ("stamp" if p.name.endswith(f".{RankFile.ACTIVE.value}")
                                       else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(path.rglob("*")) if p.is_file() and not p.is_symlink()}


def _checkpoints(rig: Rig, trial_id: int) -> dict[str, tuple[CheckpointState, str | None]]:
    with rig.store.session_scope() as s:
        return {c.uuid: (c.state, c.gc_reason) for c in s.scalars(
            select(Checkpoint).where(Checkpoint.trial_id == trial_id))}


def _events(rig: Rig, *reasons: str) -> list[tuple[int, int | None, str, str | None]]:
    with rig.store.session_scope() as s:
        return [(e.id, e.trial_id, e.reason, e.message) for e in s.scalars(
            select(Event).where(Event.reason.in_(reasons)).order_by(Event.id))]


def _record_only(worker: StorageWorker, at: float) -> None:
    """A sweep killed after it recorded every removal and before it removed anything."""
    rules = Rules.of(worker.retention)
    assert rules is not None
    for part in retention_sweep._parts(worker.store, worker.home, rules, at):
        if isinstance(part, retention_sweep.TrialPlan):
            assert retention_sweep._record(worker.store, part, rules, at, "admin")


def test_a_sweep_removes_old_runs_and_keeps_what_is_held_labelled_or_live(
        rig: Rig, tmp_path: Path) -> None:
    old = _submit(rig, tmp_path, "old", SCRIPT)
    held = _submit(rig, tmp_path, "held", SCRIPT)
    labelled = _submit(rig, tmp_path, "labelled", SCRIPT, labels=["keep", "paper"])
    live = _submit(rig, tmp_path, "live", SLEEPER, harness=False)
    ended = (old[1], held[1], labelled[1])
    rig.tick_until(lambda: all(rig.trial(t).state == "SUCCEEDED" for t in ended)
                   and rig.trial(live[1]).state == "RUNNING", what="three ended, one running")
    worker = StorageWorker(rig.store, rig.home, retention=RetentionConfig(
        logs_after=1.0, runs_after=2.0, keep_labels=["keep"]))
    _drain(worker)
    registry.create_model(rig.store, rig.admin, "held")
    version = registry.register_version(rig.store, rig.home, rig.admin, "held", held[1])
    home = rig.home
    runs = {t: home.run_dir(_uuid(rig, t)).path for t in (*ended, live[1])}
    untouched = {t: _tree(runs[t]) for t in (labelled[1], live[1])}
    old_stored = [u for u, (state, _) in _checkpoints(rig, old[1]).items()
                  if state is CheckpointState.STORED]
    assert old_stored and all((tmp_path / "storage" / u / METADATA_FILE).is_file()
                              for u in old_stored)
    at = time.time() + 10  # every experiment ended more than runs_after before

    planned = worker.retention_plan(at)
    assert planned is not None
    lines = {(line.trial_id, line.what) for line in planned.lines}
    assert lines == {(old[1], RetentionItem.RUN), (old[1], RetentionItem.CHECKPOINT),
                     (old[1], RetentionItem.ARTIFACTS), (held[1], RetentionItem.LOGS)}
    assert all(line.bytes > 0 and line.files > 0 for line in planned.lines)
    assert planned.total_bytes == sum(line.bytes for line in planned.lines)
    assert planned.complete
    first = retention_sweep.plan(worker, Rules(1.0, 2.0, keep_labels=frozenset({"keep"})),
                                 at, limit=1)
    assert not first.complete and 0 < first.total_lines < planned.total_lines
    kept = {(k.experiment_id, k.trial_id): k.why for k in planned.kept}
    assert kept[(labelled[0], None)] == "labelled 'keep' (retention.keep_labels)"
    assert "registered as held v1" in kept[(held[0], held[1])]
    assert all(runs[t].is_dir() for t in runs)  # a plan removes nothing

    _record_only(worker, at)
    recorded = _events(rig, "run files removed", "logs removed")
    assert [(t, reason) for _, t, reason, _ in recorded] == [
        (old[1], "run files removed"), (held[1], "logs removed")]
    assert "past retention.runs_after 2s; asked for by admin" in (recorded[0][3] or "")
    assert "past retention.logs_after 1s" in (recorded[1][3] or "")
    assert runs[old[1]].is_dir() and (runs[held[1]] / "attempt-1").is_dir()
    with pytest.raises(Gone, match=f"trial {old[1]}'s run directory .* was removed by "
                                   "retention on .*retention.runs_after"):
        logs.read_log(rig.store, rig.supervisor.launcher, old[1])
    with pytest.raises(Gone, match=f"trial {held[1]}'s logs were removed by retention"):
        logs.read_log(rig.store, rig.supervisor.launcher, held[1])

    done = worker.retain(at)  # the next sweep finishes what the killed one recorded
    assert done is not None and done.total_lines == planned.total_lines
    assert _events(rig, "run files removed", "logs removed") == recorded  # not twice
    assert not runs[old[1]].exists()
    assert not (home.checkpoint_cache_dir / _uuid(rig, old[1])).exists()
    after = _checkpoints(rig, old[1])
    assert {state for state, _ in after.values()} == {CheckpointState.DELETED}
    assert all((after[u][1] or "").startswith("retention: the run directory of trial")
               for u in old_stored)
    assert not any((tmp_path / "storage" / u).exists() for u in old_stored)
    by_retention = [(i, t) for i, t, _, message in _events(rig, "checkpoint deleted")
                    if "run directory: retention: " in (message or "")]
    assert [t for _, t in by_retention] == [old[1]] * len(old_stored)
    assert all(i > recorded[0][0] for i, _ in by_retention)  # recorded before, done after
    with rig.store.session_scope() as s:
        [artifact_set] = s.scalars(select(ArtifactSet).where(ArtifactSet.trial_id == old[1]))
        assert artifact_set.storage_state is CheckpointState.DELETED
    with pytest.raises(Gone, match=r"retention\.runs_after"):
        artifacts.open_artifact(rig.store, home, old[1], "model.pt")

    # The held trial: its logs gone, its run and registered checkpoint whole.
    held_attempt = home.run_dir(_uuid(rig, held[1])).attempt(1)
    assert [held_attempt.ranks_with(kind) for kind in retention_sweep.LOG_FILES] == [[]] * 3
    assert held_attempt.ranks_with(RankFile.METRICS)  # the rest of the run stays
    assert (runs[held[1]] / "workdir" / "model.pt").is_file()
    download = checkpoints.open_any_download(rig.store, home, version["checkpoint_uuid"])
    assert b"".join(download.chunks())  # its files' sha256s checked as they are read
    assert _checkpoints(rig, held[1])[version["checkpoint_uuid"]][0] is CheckpointState.STORED
    for trial_id, files in untouched.items():
        assert _tree(runs[trial_id]) == files
    assert rig.trial(live[1]).state == TrialState.RUNNING

    again = worker.retain(at + 10)
    assert again is not None and again.total_lines == 0
    assert _events(rig, "run files removed", "logs removed") == recorded


def _uuid(rig: Rig, trial_id: int) -> str:
    with rig.store.session_scope() as s:
        return s.get_one(Trial, trial_id).uuid


def test_without_retention_the_plan_is_empty_and_says_so(sqlite_store: Store,
                                                         home: Home) -> None:
    admin = Principal(user_id=1, name="admin", role=Role.ADMIN)
    for config in (None, RetentionConfig(keep_labels=["keep"])):
        worker = StorageWorker(sqlite_store, home, retention=config)
        answer = retention.sweep_runs(worker, admin, dry_run=False)
        assert (answer["enabled"], answer["lines"], answer["rules"]) == (False, [], None)
        assert answer["message"].startswith("retention is off: the cluster config has no "
                                            "`retention:` with logs_after or runs_after")
        assert worker.retain() is None


def test_a_version_registered_after_the_plan_was_read_stops_the_removal(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    rig = sqlite_rig
    experiment_id, trial_id = _submit(rig, tmp_path, "raced", SCRIPT)
    rig.run_to_end_of(experiment_id, trial_id)
    worker = StorageWorker(rig.store, rig.home, retention=RetentionConfig(runs_after=1.0))
    _drain(worker)
    at = time.time() + 10
    rules = Rules.of(worker.retention)
    assert rules is not None
    [part] = [p for p in retention_sweep._parts(rig.store, rig.home, rules, at)
              if isinstance(p, retention_sweep.TrialPlan)]
    registry.create_model(rig.store, rig.admin, "raced")
    registry.register_version(rig.store, rig.home, rig.admin, "raced", trial_id)

    assert not retention_sweep._record(rig.store, part, rules, at, None)
    assert _events(rig, "run files removed") == []
    done = worker.retain(at)
    assert done is not None and done.total_lines == 0
    assert [k.trial_id for k in done.kept] == [trial_id]
    assert rig.home.run_dir(_uuid(rig, trial_id)).path.is_dir()
