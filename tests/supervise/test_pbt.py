"""Population-based training with real trial processes: each generation is drawn only once
the one before has ended; every member of a later generation starts from its parent's
checkpoint (the weight it trained on goes on, and its line of trial ids with it), the worst
members are replaced by copies of the best with changed hyperparameters, a member that fails
is replaced too, and each trial is verified on its own round. A generation none of whose
members left a result stops the search with why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.services.experiments import create_experiment
from muster.states import EventReason, ExperimentState, TrialState
from muster.store import Checkpoint, Event, Trial
from tests.supervise.conftest import Rig, fixture_entrypoint
from tests.supervise.test_search import run_search, trials_of

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(240)]
POPULATION, ROUNDS, LENGTH = 4, 3, 3


def submit_pbt(rig: Rig, fail_above: float | None = None, **searcher: Any) -> int:
    config: dict[str, Any] = {
        "name": "pbt-test",
        "entrypoint": fixture_entrypoint("pbt_job.py"),
        "harness": True,
        "environment": {"variables": {} if fail_above is None
                        else {"FAIL_ABOVE": str(fail_above)}},
        "hyperparameters": {"lr": {"type": "double", "minval": 0.05, "maxval": 0.9},
                            "width": 8},
        "searcher": {"name": "pbt", "metric": "loss", "smaller_is_better": True,
                     "population_size": POPULATION, "num_rounds": ROUNDS,
                     "length_per_round": LENGTH, "max_concurrent_trials": 2,
                     "replace_function": {"truncate_fraction": 0.25},
                     "explore_function": {"resample_probability": 0.0,
                                          "perturb_factor": 0.2}} | searcher,
        "failure_policy": {"trial_retries": 0},
        "reproducibility": {"experiment_seed": 11},
    }
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                             archive=None)


def final_state(rig: Rig, trial: Trial) -> dict[str, Any]:
    """What the trial's own last checkpoint holds (state.json)."""
    with rig.store.session_scope() as s:
        row = s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial.id)
                        .order_by(Checkpoint.step.desc())).first()
        assert row is not None, f"trial {trial.id} saved no checkpoint"
        found: dict[str, Any] = json.loads((Path(row.path) / "state.json").read_text())
        return found


def test_each_generation_continues_or_copies_the_best_of_the_one_before(
        sqlite_rig: Rig) -> None:
    experiment_id = submit_pbt(sqlite_rig)
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert len(trials) == POPULATION * ROUNDS
    assert {t.state for t in trials} == {TrialState.SUCCEEDED.value}
    assert all((t.verification or {}).get("verified") is True for t in trials), [
        t.verification for t in trials if not (t.verification or {}).get("verified")]
    states = {t.number: final_state(sqlite_rig, t) for t in trials}
    losses = {n: (state["w"] - 1) ** 2 for n, state in states.items()}
    for trial in trials:
        lineage = (trial.search_state or {})["pbt"]
        generation = trial.number // POPULATION
        assert lineage["generation"] == generation
        state = states[trial.number]
        assert state["from"] == generation * LENGTH  # its parent's step ...
        if generation == 0:
            assert lineage["parent"] is None and trial.source_checkpoint_id is None
            assert state["line"] == [trial.id]
            continue
        # ... on its parent's weight: the line of trials it went through is the parent's.
        parent = trials[lineage["parent"]]
        assert parent.number // POPULATION == generation - 1
        assert state["line"] == [*states[parent.number]["line"], trial.id]
        with sqlite_rig.store.session_scope() as s:
            source = s.get_one(Checkpoint, trial.source_checkpoint_id)
            assert (source.trial_id, source.step) == (parent.id, generation * LENGTH)
            assert lineage["checkpoint_uuid"] == source.uuid
        assert lineage["parent_trial_id"] == parent.id
        # The previous generation started after its own, and this one after it ended.
        before = trials[(generation - 1) * POPULATION:generation * POPULATION]
        assert trial.created_at >= max(t.ended_at or 0 for t in before)
    for generation in range(1, ROUNDS):
        members = trials[generation * POPULATION:(generation + 1) * POPULATION]
        before = trials[(generation - 1) * POPULATION:generation * POPULATION]
        ranked = sorted(before, key=lambda t: (losses[t.number], t.number))
        actions = [(t.search_state or {})["pbt"]["action"] for t in members]
        assert actions.count("exploit") == 1, actions  # a quarter of four
        [copy] = [t for t in members if t.search_state["pbt"]["action"] == "exploit"]
        lineage = copy.search_state["pbt"]
        assert lineage["parent"] == ranked[0].number  # the best goes on twice ...
        assert lineage["replaces"] == ranked[-1].number  # ... in the worst one's place
        assert copy.number % POPULATION == ranked[-1].number % POPULATION
        assert copy.hparams["lr"] != ranked[0].hparams["lr"]  # explored: ±20%
        assert copy.hparams["lr"] == pytest.approx(ranked[0].hparams["lr"] * 0.8) or \
            copy.hparams["lr"] == pytest.approx(min(0.9, ranked[0].hparams["lr"] * 1.2))
        assert lineage["changed"] == {"lr": [ranked[0].hparams["lr"], copy.hparams["lr"]]}
        assert copy.hparams["width"] == 8  # a constant stays
        for member in members:
            if member is not copy:
                previous = before[member.number % POPULATION]
                assert member.search_state["pbt"]["parent"] == previous.number
                assert member.hparams == previous.hparams  # continued as it was


def test_a_member_that_failed_is_replaced_and_a_generation_without_results_stops(
        sqlite_rig: Rig) -> None:
    """With learning rates over 0.6 failing, generation 0's failed members are replaced by
    copies of those that succeeded; when none succeeds, the search says why it stops."""
    experiment_id = submit_pbt(sqlite_rig, fail_above=0.6, num_rounds=2)
    state = run_search(sqlite_rig, experiment_id)
    trials = trials_of(sqlite_rig.store, experiment_id)
    first = trials[:POPULATION]
    failed = [t for t in first if t.state == TrialState.FAILED.value]
    assert failed and len(failed) < POPULATION, [t.hparams for t in first]
    assert state is ExperimentState.COMPLETED and len(trials) == 2 * POPULATION
    for member in trials[POPULATION:]:
        lineage = member.search_state["pbt"]
        replaced = first[member.number % POPULATION]
        parent = trials[lineage["parent"]]
        assert parent.state == TrialState.SUCCEEDED.value
        if replaced in failed:
            assert lineage["action"] == "exploit" and lineage["replaces"] == replaced.number

    stopped = submit_pbt(sqlite_rig, fail_above=0.01, num_rounds=2)
    assert run_search(sqlite_rig, stopped) is ExperimentState.ERROR
    trials = trials_of(sqlite_rig.store, stopped)
    assert len(trials) == POPULATION
    with sqlite_rig.store.session_scope() as s:
        [why] = s.scalars(select(Event.message).where(
            Event.experiment_id == stopped, Event.reason == EventReason.SEARCH_STOPPED))
    assert "no trial of generation 0 (trials 1 to 4) ended SUCCEEDED with the metric 'loss' " \
           "and an intact checkpoint" in why


def test_a_parents_checkpoint_is_held_while_a_member_that_starts_from_it_runs(
        sqlite_rig: Rig) -> None:
    """GC and retention keep a PBT parent's checkpoint until every trial that starts from
    it has ended (`checkpoint_storage.pins`): a member that restarts before its first save
    copies it again."""
    from muster.checkpoint_storage.pins import held
    from tests.store.rows import add_experiment, add_trial

    with sqlite_rig.store.session_scope() as s:
        exp = add_experiment(s)
        parent, child, other = (add_trial(s, exp, "SUCCEEDED"), add_trial(s, exp),
                                add_trial(s, exp))
        row = Checkpoint(trial_id=parent.id, name="step-000000000003-0a1b2c3d",
                         path="/nonexistent", step=3, size_bytes=1, file_count=1, intact=True)
        s.add(row)
        s.flush()
        child.source_checkpoint_id = other.source_checkpoint_id = row.id
        ids = (row.id, child.id, other.id)
    with sqlite_rig.store.session_scope() as s:
        assert held(s, [ids[0]]) == {ids[0]: f"trials {ids[1]}, {ids[2]} start from it and "
                                              "have not ended"}
        s.get_one(Trial, ids[1]).state = TrialState.RUNNING.value
        s.get_one(Trial, ids[2]).state = TrialState.SUCCEEDED.value
    with sqlite_rig.store.session_scope() as s:
        assert held(s, [ids[0]]) == {ids[0]: f"trial {ids[1]} starts from it and has not "
                                              "ended"}
        s.get_one(Trial, ids[1]).state = TrialState.FAILED.value
    with sqlite_rig.store.session_scope() as s:
        assert held(s, [ids[0]]) == {}


def submit_epochs(rig: Rig, skip_to: int | None = None) -> int:
    """Two members, three rounds of two epochs, of tests/fixtures/pbt_epochs_job.py."""
    config: dict[str, Any] = {
        "name": "pbt-epochs",
        "entrypoint": fixture_entrypoint("pbt_epochs_job.py"),
        "harness": True,
        "environment": {"variables": {} if skip_to is None else {"SKIP_TO": str(skip_to)}},
        "hyperparameters": {"lr": {"type": "double", "minval": 0.1, "maxval": 0.9}},
        "searcher": {"name": "pbt", "metric": "loss", "smaller_is_better": True,
                     "population_size": 2, "num_rounds": 3 if skip_to is None else 2,
                     "length_per_round": {"epochs": 2}, "max_concurrent_trials": 2},
        "verify": {"expected_samples": 40},
        "failure_policy": {"trial_retries": 0},
        "reproducibility": {"experiment_seed": 5},
    }
    return create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                             archive=None)


def completed_of(trial: Trial) -> str:
    return next(c["detail"] for c in (trial.verification or {})["checks"]
                if c["name"] == "completed")


def test_a_members_epochs_go_on_from_its_parents_and_an_epoch_number_is_not_training(
        sqlite_rig: Rig) -> None:
    """A member counted in epochs reaches its round's end with its parent's epochs and its
    own, down a line of three generations (each verdict keeps what it counted for the next);
    a member whose script numbers one epoch as its round's last has trained one epoch, not
    its round, and is not verified."""
    experiment_id = submit_epochs(sqlite_rig)
    assert run_search(sqlite_rig, experiment_id) is ExperimentState.COMPLETED
    trials = trials_of(sqlite_rig.store, experiment_id)
    assert all((t.verification or {}).get("verified") is True for t in trials), [
        t.verification for t in trials]
    for trial in trials:
        generation = trial.number // 2
        reached = 2 * (generation + 1)
        assert completed_of(trial) == (f"reached epoch {reached} of {reached} "
                                       "(searcher.length_per_round)")
        assert trial.verification["epochs"] == {"whole": reached, "last": reached}

    skipped = submit_epochs(sqlite_rig, skip_to=4)
    # A SUSPECT trial waits for a review, and its experiment with it: wait for the four.
    sqlite_rig.tick_until(
        lambda: len(found := trials_of(sqlite_rig.store, skipped)) == 4 and all(
            TrialState(t.state).is_at_rest() for t in found),
        what="both generations to come to rest", timeout=150)
    trials = trials_of(sqlite_rig.store, skipped)
    assert [t.state for t in trials[:2]] == [TrialState.SUCCEEDED.value] * 2
    for member in trials[2:]:
        assert member.state == TrialState.SUSPECT.value, member.verification
        assert completed_of(member).startswith("stopped at epoch 1 of 4 (25%")


def test_a_source_is_credited_from_its_passing_verdict_at_its_newest_checkpoint(
        sqlite_rig: Rig) -> None:
    """What a warm-started trial is credited: its source's counted epochs, only from a
    verdict that passed and only at the newest checkpoint the source saved."""
    from muster.supervise.ending import _source_epochs
    from muster.supervise.verification import SourceEpochs
    from tests.store.rows import add_experiment, add_trial

    counted = {"passed": True, "verified": True, "checks": [],
               "epochs": {"whole": 4, "last": 4}}
    with sqlite_rig.store.session_scope() as s:
        source = add_trial(s, add_experiment(s), "SUCCEEDED")
        source.verification = counted
        older, newest = (Checkpoint(trial_id=source.id, name=f"step-{step}", path="/nonexistent",
                                    step=step, size_bytes=1, file_count=1, intact=True)
                         for step in (2, 4))
        s.add_all([older, newest])
        s.flush()
        assert _source_epochs(s, source.id, newest.id) == SourceEpochs(4, 4)
        assert _source_epochs(s, source.id, older.id) is None  # trained past it
        source.verification = {**counted, "passed": False}  # SUSPECT: no evidence
        assert _source_epochs(s, source.id, newest.id) is None
        source.verification = {k: v for k, v in counted.items() if k != "epochs"}
        assert _source_epochs(s, source.id, newest.id) is None  # counted steps, or older
