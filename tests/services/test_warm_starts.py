"""Warm starts with real runs (issue 35, deliverable 3): an experiment whose trials start
from a checkpoint muster holds (`searcher.source_model`, `source_trial_id`,
`source_checkpoint_uuid`), resolved at submission, copied into each trial's run directory at
its first launch and handed to the script by `restore()`; later attempts resume from the
trial's own checkpoints; GC and deletes keep the source while the experiment runs; lineage,
the views and `trial diff` name it.

One supervisor and one trained source (a tiny PyTorch linear model,
tests/fixtures/warm_start_linear.py, registered as model `m` v1) serve the whole module."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.checkpoint_storage.worker import StorageWorker
from muster.config.schema import SearcherConfig
from muster.errors import ConfigError, Conflict
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.rundir import AttemptDir, RunDir
from muster.schedule.local_placement import LocalPlacement
from muster.services import registry, retention, snapshots, warm_starts
from muster.services.experiments import (
    create_experiment,
    describe_experiment,
    describe_trial,
    kill_experiment,
    review_trial,
)
from muster.states import CheckpointState, EventReason, ModelStage, TrialState
from muster.store import Checkpoint, Event, Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import first_admin
from tests.processes import kill_home_processes
from tests.supervise.conftest import FIXTURES, Rig, Submitted, fixture_entrypoint

pytest.importorskip("torch", reason="the warm start model is a PyTorch one")

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

STEPS = 5  # the source trains 5 steps; each warm-started trial trains 5 more


@dataclass(frozen=True)
class Trained:
    """The source: trial A, its experiment, its checkpoints by step, and its losses."""

    trial_id: int
    experiment_id: int
    checkpoints: dict[int, str]  # step -> uuid
    names: dict[int, str]  # step -> its directory's name
    first_loss: float  # of its seeded weights: a cold start's
    losses: dict[int, float]  # step -> the loss after that step


@pytest.fixture(scope="module")
def warm_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    top = tmp_path_factory.mktemp("warm-starts")
    home = Home(top / "home").ensure()
    store = Store(f"sqlite:///{top / 'muster.db'}")
    store.upgrade()
    supervisor = Supervisor(store, LocalLauncher(), home, LocalPlacement(store, slots=4),
                            min_free_disk=0)
    try:
        yield Rig(store, home, supervisor, first_admin(store, home))
    finally:
        kill_home_processes(home.root)
        store.dispose()


@pytest.fixture(scope="module")
def trained(warm_rig: Rig) -> Trained:
    """Trial A, run to its verified end and registered as model `m` v1 (its latest)."""
    rig = warm_rig
    [job] = _run(rig, {})
    assert _described(rig, job.trial_id)["verified"] is True
    registry.create_model(rig.store, rig.admin, "m")
    assert registry.register_version(rig.store, rig.home, rig.admin, "m",
                                     job.trial_id)["version"] == 1
    with rig.store.session_scope() as s:
        rows = list(s.scalars(select(Checkpoint).where(Checkpoint.trial_id == job.trial_id)))
        checkpoints, names = {c.step: c.uuid for c in rows}, {c.step: c.name for c in rows}
    log = _log(rig, job.trial_id)
    return Trained(job.trial_id, job.experiment_id, checkpoints, names, _first_loss(log),
                   {int(step): float(loss)
                    for step, loss in re.findall(r"^step (\d+) loss (\S+)$", log, re.M)})


def test_a_model_versions_weights_are_where_its_trials_start(warm_rig: Rig,
                                                             trained: Trained) -> None:
    rig = warm_rig
    [job] = _run(rig, {"source_model": "m@1"})

    log = _log(rig, job.trial_id)
    assert f"warm start from step {STEPS} of trial {trained.trial_id}" in log
    # The weights are A's last: its loss where A ended, far below a cold start's.
    assert _first_loss(log) == pytest.approx(trained.losses[STEPS], rel=1e-9)
    assert trained.first_loss > 10 * trained.losses[STEPS]
    trial = _described(rig, job.trial_id)
    assert trial["verified"] is True, trial["verification"]
    source = {"named": "source_model: m@1", "checkpoint_uuid": trained.checkpoints[STEPS],
              "checkpoint": trained.names[STEPS], "step": STEPS, "trial_id": trained.trial_id,
              "experiment_id": trained.experiment_id, "model": "m", "version": 1}
    assert trial["source"] == source
    assert describe_experiment(rig.store, job.experiment_id)["source"] == source
    # The copy is the trial's own to read; its checkpoints are only those it saved.
    run_dir = RunDir(rig.home.run_dir(trial["uuid"]).path)
    assert [p.name for p in run_dir.source.iterdir()] == [source["checkpoint"]]
    with rig.store.session_scope() as s:
        saved = s.scalars(select(Checkpoint.step).where(Checkpoint.trial_id == job.trial_id))
        assert sorted(saved) == list(range(1, STEPS + 1))
    said = _events(rig, job.trial_id, EventReason.WARM_START)
    assert said == [f"attempt 1 starts from the warm start, checkpoint {source['checkpoint']} "
                    f"(step {STEPS}) of trial {trained.trial_id} (model m v1): the trial has "
                    "no checkpoint of its own yet"]

    # Lineage: a version registered from the warm-started trial names where it began.
    v2 = registry.register_version(rig.store, rig.home, rig.admin, "m", job.trial_id)
    assert v2["lineage"]["source"] == source
    # `muster trial diff A B`: the weights it started from, first of the config group.
    diff = snapshots.diff_trials(rig.store, rig.home, trained.trial_id, job.trial_id)
    fields = {d["field"]: (d["a"], d["b"]) for d in diff["differences"]}
    assert fields["source.checkpoint_uuid"] == (None, trained.checkpoints[STEPS])
    assert fields["source.model"] == (None, "m")
    assert fields["config.searcher.source_model"] == (None, "m@1")


def test_a_stage_is_resolved_once_at_submission(warm_rig: Rig, trained: Trained) -> None:
    """`m@production` names v1 when the experiment is submitted; moving production to v2
    later does not change what it starts from."""
    rig = warm_rig
    if len(registry.describe_model(rig.store, "m")["versions"]) < 2:
        registry.register_version(rig.store, rig.home, rig.admin, "m", trained.trial_id,
                                  checkpoint=trained.checkpoints[2])
    registry.set_stage(rig.store, rig.admin, registry.VersionRef.parse("m@1"),
                       ModelStage.PRODUCTION)
    experiment_id = _submit(rig, {"source_model": "m@production"})
    registry.set_stage(rig.store, rig.admin, registry.VersionRef.parse("m@2"),
                       ModelStage.PRODUCTION)

    source = describe_experiment(rig.store, experiment_id)["source"]
    assert source is not None
    assert (source["version"], source["checkpoint_uuid"]) == (1, trained.checkpoints[STEPS])
    kill_experiment(rig.store, rig.admin, experiment_id)
    rig.tick_until(lambda: rig.experiment_state(experiment_id).is_terminal(),
                   what="the killed experiment to end")


def test_a_trial_id_or_a_checkpoint_uuid_starts_from_that_checkpoint(
        warm_rig: Rig, trained: Trained) -> None:
    rig = warm_rig
    by_trial, by_uuid = _run(rig, {"source_trial_id": trained.trial_id},
                             {"source_checkpoint_uuid": trained.checkpoints[2]})

    assert _first_loss(_log(rig, by_trial.trial_id)) == pytest.approx(
        trained.losses[STEPS], rel=1e-9)  # its latest
    assert _first_loss(_log(rig, by_uuid.trial_id)) == pytest.approx(
        trained.losses[2], rel=1e-9)
    for job, named, step in ((by_trial, f"source_trial_id: {trained.trial_id}", STEPS),
                             (by_uuid, f"source_checkpoint_uuid: {trained.checkpoints[2]}", 2)):
        trial = _described(rig, job.trial_id)
        assert trial["verified"] is True, trial["verification"]
        assert trial["source"] is not None
        assert (trial["source"]["named"], trial["source"]["step"], trial["source"]["model"]) \
            == (named, step, None)
    # `source_checkpoint: best` takes the trial's lowest `loss` (its last step, here).
    with rig.store.session_scope() as s:
        best = warm_starts.resolve_source(s, SearcherConfig(
            source_trial_id=trained.trial_id, source_checkpoint="best"), "exp.yaml")
    assert best is not None and best.view["checkpoint_uuid"] == trained.checkpoints[STEPS]


def test_a_warm_start_that_trained_no_step_of_its_own_is_not_verified(
        warm_rig: Rig, trained: Trained) -> None:
    """A script that takes the source's step for its own (it never looks at
    `restore().warm_start`) and plans no more steps than the source trained runs no step,
    yet its final report and checkpoint reach its plan: SUSPECT, not verified. Planned past
    the source's step, the same script trains steps of its own and is verified."""
    rig = warm_rig
    idle, more = (_created(rig, _config({"source_trial_id": trained.trial_id}, steps=steps,
                                        keep_source_step=True)) for steps in (STEPS, STEPS + 3))
    rig.tick_until(lambda: all(TrialState(rig.trial(j.trial_id).state).is_at_rest()
                               for j in (idle, more)), what="the trials to end")

    assert re.findall(r"^step \d+ loss", _log(rig, idle.trial_id), re.M) == []  # no step
    trial = _described(rig, idle.trial_id)
    assert (trial["state"], trial["verified"]) == ("SUSPECT", False)
    completed = {c["name"]: c for c in trial["verification"]["checks"]}["completed"]
    assert completed["detail"].startswith(
        f"the trial started from the warm start's checkpoint {trained.names[STEPS]} of trial "
        f"{trained.trial_id} at step {STEPS} and reported step {STEPS} only, nothing past it")
    assert f"its plan ({STEPS} steps; ctx.plan()) does not pass step {STEPS}" in \
        completed["detail"]
    assert {c["name"] for c in trial["verification"]["checks"] if not c["passed"]} == {
        "completed"}  # its checkpoint and metrics are fine: only the training is missing

    log = _log(rig, more.trial_id)
    assert [int(s) for s in re.findall(r"^step (\d+) loss", log, re.M)] == [6, 7, 8]
    trial = _described(rig, more.trial_id)
    assert (trial["state"], trial["verified"]) == ("SUCCEEDED", True), trial["verification"]
    # A SUSPECT trial waits for a person's word: its experiment ends once it is rejected.
    review_trial(rig.store, rig.admin, idle.trial_id, "reject", "trained no step")
    rig.tick_until(lambda: rig.experiment_state(idle.experiment_id).is_terminal(),
                   what="the experiment to end")


@pytest.mark.parametrize(("searcher", "problem"), [
    ({"source_model": "nope@1"},
     "searcher.source_model: no model named 'nope'; `muster model list` shows the models"),
    ({"source_model": "m@9"},
     "searcher.source_model: model m has no version m@9; `muster model versions m` lists them"),
    ({"source_model": "m@best"}, "searcher.source_model: 'm@best' does not name a version"),
    ({"source_trial_id": 99999},
     "searcher.source_trial_id: there is no trial 99999; `muster experiment describe ID` "
     "lists an experiment's trials"),
    ({"source_checkpoint_uuid": "00000000-0000-4000-8000-000000000000"},
     "searcher.source_checkpoint_uuid: there is no checkpoint 00000000-0000-4000-8000-"
     "000000000000; `muster checkpoint list TRIAL_ID` shows a trial's"),
])
def test_a_source_muster_does_not_hold_is_refused_at_submission(
        warm_rig: Rig, trained: Trained, searcher: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        _submit(warm_rig, searcher)
    assert info.value.http_status == 422
    assert problem in str(info.value), info.value


@pytest.mark.parametrize("damage", ["not intact", "deleted"])
def test_a_checkpoint_not_intact_or_deleted_is_refused_at_submission(
        warm_rig: Rig, trained: Trained, damage: str) -> None:
    rig, uuid = warm_rig, trained.checkpoints[1]
    with rig.store.session_scope() as s:
        row = s.scalars(select(Checkpoint).where(Checkpoint.uuid == uuid)).one()
        was = (row.intact, row.problem, row.state, row.gc_reason)
        if damage == "deleted":
            row.state, row.gc_reason = CheckpointState.DELETED, "not among the 1 latest"
        else:
            row.intact, row.problem = False, "model.pt does not match its sha256"
    try:
        with pytest.raises(ConfigError) as info:
            _submit(rig, {"source_checkpoint_uuid": uuid})
    finally:
        with rig.store.session_scope() as s:
            row = s.scalars(select(Checkpoint).where(Checkpoint.uuid == uuid)).one()
            row.intact, row.problem, row.state, row.gc_reason = was
    expected = ("was deleted (not among the 1 latest)" if damage == "deleted"
                else "is not intact (model.pt does not match its sha256)")
    assert (f"searcher.source_checkpoint_uuid: checkpoint {uuid} (" in str(info.value)
            and f"{expected}; `muster checkpoint list {trained.trial_id}` shows the trial's "
                "checkpoints" in str(info.value)), info.value


def test_a_retry_resumes_from_the_trials_own_checkpoint_not_the_source(
        warm_rig: Rig, trained: Trained) -> None:
    """SIGKILLed after its own checkpoint of step 2 (no restart in place: a new attempt),
    the warm-started trial's attempt 2 goes on from that checkpoint."""
    rig = warm_rig
    [job] = _run(rig, {"source_trial_id": trained.trial_id}, kill_after=2,
                 failure_policy={"replica_restarts": 0})

    view = rig.trial(job.trial_id)
    assert [a.replica_reason for a in view.attempts] == ["INFRA", "OK"], view.message
    first, second = (_log(rig, job.trial_id, n) for n in (1, 2))
    assert "warm start from step" in first and "warm start" not in second
    assert "resumed own step 2" in second
    own_step_2 = float(re.findall(r"^step 2 loss (\S+)$", first, re.M)[0])
    assert _first_loss(second) == pytest.approx(own_step_2, rel=1e-9)
    assert _events(rig, job.trial_id, EventReason.WARM_START)[0].startswith("attempt 1 ")
    assert len(_events(rig, job.trial_id, EventReason.WARM_START)) == 1
    assert _described(rig, job.trial_id)["verified"] is True


def test_gc_and_delete_keep_the_source_while_its_experiment_runs(warm_rig: Rig,
                                                                 tmp_path: Path) -> None:
    """A source experiment S of three checkpoints that nothing registered; an experiment E
    that starts from S's first one. Until E has ended, GC keeps that checkpoint (saying
    why) and S cannot be deleted; then both may go."""
    rig = warm_rig
    entrypoint = [sys.executable, str(FIXTURES / "checkpoint_series.py"), "0.5,0.2,0.4"]
    config = {"name": "series", "harness": True, "entrypoint": entrypoint,
              "searcher": {"name": "single", "metric": "val_loss"},
              "checkpoint_storage": {"type": "shared_fs", "path": str(tmp_path / "storage")}}
    source_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config))
    with rig.store.session_scope() as s:
        source_trial = s.scalars(select(Trial.id).where(Trial.experiment_id == source_id)).one()
    rig.run_to_end_of(source_id, source_trial)
    with rig.store.session_scope() as s:
        first = s.scalars(select(Checkpoint).where(Checkpoint.trial_id == source_trial,
                                                   Checkpoint.step == 1)).one().uuid
    config["searcher"] = {"name": "single", "metric": "val_loss",
                          "source_checkpoint_uuid": first}
    holder = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                               sources=warm_starts.resolve_source)  # not run: it waits

    worker = StorageWorker(rig.store, rig.home)
    kept = {p.step: p for p in worker.collect(source_id)}  # its best is 2, its latest 3
    assert kept[1].keep and kept[1].reasons == (
        f"experiment {holder} starts its trials from it and has not ended",)
    with rig.store.session_scope() as s:
        row = s.scalars(select(Checkpoint).where(Checkpoint.uuid == first)).one()
        assert (row.state, Path(row.path).is_dir()) == ("local", True)
    with pytest.raises(Conflict, match=f"holds the checkpoints that experiment {holder} "
                                       r"\(from step-\d+-\w+, trial \d+\) start their trials "
                                       "from"):
        retention.delete_experiment(rig.store, None, rig.admin, source_id)

    kill_experiment(rig.store, rig.admin, holder)
    rig.tick_until(lambda: rig.experiment_state(holder).is_terminal(),
                   what="the holder to end")
    assert not {p.step: p for p in worker.plan_for(source_id)}[1].keep
    assert retention.delete_experiment(rig.store, None, rig.admin, source_id)["deleting"]


def test_a_determined_config_with_source_trial_id_runs_from_that_trial(
        warm_rig: Rig) -> None:
    """Determined's Core API (`compat: determined`): `get_cluster_info().latest_checkpoint`
    is the source trial's checkpoint, and the script, seeing another trial's id in it,
    counts its steps from 0, as Determined's tutorial does."""
    rig = warm_rig

    def determined(value: float, **searcher: Any) -> str:
        return yaml.safe_dump({
            "name": "det-warm", "max_restarts": 0,
            "entrypoint": f"python3 {FIXTURES / 'determined_warm_start.py'}",
            "hyperparameters": {"value": value},
            "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 3},
                         **searcher}})

    first = _created(rig, determined(100.0))
    rig.run_to_end(first)
    second = _created(rig, determined(0.0, source_trial_id=first.trial_id))
    rig.run_to_end(second)

    assert f"started from 103.0 (trial {first.trial_id}, step 0)" in _log(rig, second.trial_id)
    trial = _described(rig, second.trial_id)
    assert (trial["integration"], trial["verified"]) == ("determined", True)
    assert trial["source"] is not None and trial["source"]["trial_id"] == first.trial_id
    with rig.store.session_scope() as s:
        said = s.scalars(select(Event.message).where(
            Event.experiment_id == second.experiment_id,
            Event.reason == EventReason.DETERMINED_KEY_MAPPED)).all()
    assert f"Determined's searcher.source_trial_id: {first.trial_id} → the same" in said


# -- helpers -------------------------------------------------------------------------------


def _config(searcher: dict[str, Any], kill_after: int | None = None,
            failure_policy: dict[str, Any] | None = None, steps: int = STEPS,
            keep_source_step: bool = False) -> str:
    args = ([str(steps)] + (["--kill-after", str(kill_after)] if kill_after else [])
            + (["--keep-source-step"] if keep_source_step else []))
    return yaml.safe_dump({
        "name": "warm", "harness": True,
        "entrypoint": fixture_entrypoint("warm_start_linear.py", *args),
        "environment": {"variables": {"OMP_NUM_THREADS": "1"}},
        "searcher": {"name": "single", "metric": "loss", **searcher},
        "failure_policy": {"stop_grace": 5.0, **(failure_policy or {})}})


def _submit(rig: Rig, searcher: dict[str, Any], **options: Any) -> int:
    return create_experiment(rig.store, rig.home, rig.admin, _config(searcher, **options),
                             sources=warm_starts.resolve_source)


def _created(rig: Rig, text: str) -> Submitted:
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, text,
                                      sources=warm_starts.resolve_source)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id))
        return Submitted(experiment_id, trial_id.one())


def _run(rig: Rig, *searchers: dict[str, Any], **options: Any) -> list[Submitted]:
    """An experiment per searcher block, run together to their ends."""
    jobs = [_created(rig, _config(searcher, **options)) for searcher in searchers]
    rig.tick_until(lambda: all(rig.experiment_state(j.experiment_id).is_terminal()
                               for j in jobs), what="the experiments to end")
    return jobs


def _described(rig: Rig, trial_id: int) -> Any:
    return describe_trial(rig.store, trial_id)


def _log(rig: Rig, trial_id: int, attempt: int = 1) -> str:
    run_dir = rig.trial(trial_id).attempts[attempt - 1].run_dir
    return AttemptDir(run_dir).rank(0).log.read_text()


def _first_loss(log: str) -> float:
    return float(re.findall(r"^first loss (\S+)$", log, re.M)[0])


def _events(rig: Rig, trial_id: int, reason: EventReason) -> list[str]:
    with rig.store.session_scope() as s:
        return [m or "" for m in s.scalars(select(Event.message).where(
            Event.trial_id == trial_id, Event.reason == reason).order_by(Event.id))]
