"""The model registry's rules on real trials (real processes, the real store): a verified
trial's checkpoint becomes v1, v2... with its lineage; an unverified one only with a reason
an admin gives, marked; a rejected one never; a user registers from its own trials only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.checkpoint_storage.worker import StorageWorker
from muster.errors import Conflict, Forbidden, InvalidRequest, NotFound
from muster.services import registry, retention
from muster.services.access import Principal
from muster.services.experiments import create_experiment, review_trial
from muster.states import ModelStage, Role, TrialState
from muster.store import Checkpoint, Event, Trial
from tests.accounts import add_user
from tests.supervise.conftest import FIXTURES, Rig, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


def _run(rig: Rig, who: Principal, **config: Any) -> int:
    """A trial of search_job.py (validation `loss` at steps 1..3, a checkpoint at the end),
    run to rest; its id."""
    text = yaml.safe_dump({
        "name": "registry", "entrypoint": fixture_entrypoint("search_job.py"), "harness": True,
        "hyperparameters": {"x": 0.5},
        "searcher": {"name": "single", "metric": "loss", "max_length": 3},
        "failure_policy": {"stop_grace": 5.0}, **config})
    experiment_id = create_experiment(rig.store, rig.home, who, text, archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    rig.tick_until(lambda: TrialState(rig.trial(trial_id).state).is_at_rest(),
                   what="the trial to end")
    return int(trial_id)


@pytest.fixture
def alice(sqlite_rig: Rig) -> Principal:
    return add_user(sqlite_rig.store, "alice")


def test_a_verified_trial_is_registered_with_its_lineage(sqlite_rig: Rig,
                                                         alice: Principal) -> None:
    rig = sqlite_rig
    trial_id = _run(rig, alice)
    assert rig.trial(trial_id).state == "SUCCEEDED"
    registry.create_model(rig.store, alice, "digits-mlp", "an MLP on digits", ["demo"])

    v1 = registry.register_version(rig.store, rig.home, alice, "digits-mlp", trial_id)
    v2 = registry.register_version(rig.store, rig.home, alice, "digits-mlp", trial_id,
                                   pick="best")

    with rig.store.session_scope() as s:
        [checkpoint] = s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial_id))
        uuid, name = checkpoint.uuid, checkpoint.name
    assert (v1["version"], v2["version"]) == (1, 2)
    assert (v1["verified"], v1["accepted_unverified"], v1["stage"]) == (True, None, "none")
    assert (v1["checkpoint_uuid"], v1["trial_id"], v1["registered_by"]) == (
        uuid, trial_id, "alice")
    assert v1["metrics"] == {"loss": pytest.approx((0.5 - 0.3) ** 2 + 1 / 3)}
    lineage = v1["lineage"]
    assert lineage["checkpoint"]["name"] == name and lineage["owner"] == "alice"
    assert lineage["verification"]["verified"] is True and lineage["verdict"] == "verified"
    assert lineage["hparams"] == {"x": 0.5}
    assert len(v1["snapshot"]["code"]) == 64 and len(v1["snapshot"]["config_sha256"]) == 64
    described = registry.describe_model(rig.store, "digits-mlp")
    assert [v["version"] for v in described["versions"]] == [1, 2]
    assert (described["description"], described["labels"]) == ("an MLP on digits", ["demo"])
    with rig.store.session_scope() as s:
        said = s.scalars(select(Event.message).where(Event.entity == "model")).all()
    assert said[0] == "model digits-mlp created"
    assert said[1] == f"digits-mlp v1: checkpoint {name} (step 3) of trial {trial_id}"


def test_an_unverified_trial_needs_an_admins_reason_and_carries_it(
        sqlite_rig: Rig, alice: Principal) -> None:
    rig = sqlite_rig
    trial_id = _run(rig, alice, verify={"expected_length": {"steps": 10}})  # stops at 3
    assert rig.trial(trial_id).state == "SUSPECT"
    registry.create_model(rig.store, alice, "short")

    with pytest.raises(Conflict, match=r"is not verified \(SUSPECT: completed: stopped at step "
                                       r"3 of 10.*--accept-unverified REASON"):
        registry.register_version(rig.store, rig.home, alice, "short", trial_id)
    with pytest.raises(Forbidden, match="only an admin can accept it unverified"):
        registry.register_version(rig.store, rig.home, alice, "short", trial_id,
                                  accept_unverified="good enough for the demo")
    owner_allowed = registry.register_version(
        rig.store, rig.home, alice, "short", trial_id, accept_unverified="as a baseline",
        owners_accept_unverified=True)
    by_admin = registry.register_version(rig.store, rig.home, rig.admin, "short", trial_id,
                                         accept_unverified="  checked the curve by hand ")

    assert owner_allowed["verified"] is False
    assert owner_allowed["accepted_unverified"] is not None
    assert owner_allowed["accepted_unverified"]["by"] == "alice"
    accepted = by_admin["accepted_unverified"]
    assert accepted is not None and (accepted["reason"], accepted["by"]) == (
        "checked the curve by hand", "admin")
    with rig.store.session_scope() as s:
        said = s.scalars(select(Event.message).where(Event.entity == "model")).all()
    assert said[-1].endswith("; unverified, accepted by admin: checked the curve by hand")

    review_trial(rig.store, rig.admin, trial_id, "reject", "the curve is wrong")
    with pytest.raises(Conflict, match=r"was rejected on review .* can never be registered"):
        registry.register_version(rig.store, rig.home, rig.admin, "short", trial_id,
                                  accept_unverified="anyway")


def test_who_may_register_what(sqlite_rig: Rig, alice: Principal) -> None:
    rig = sqlite_rig
    trial_id = _run(rig, alice)
    bob = add_user(rig.store, "bob")
    vera = add_user(rig.store, "vera", Role.VIEWER)
    registry.create_model(rig.store, bob, "bobs")

    with pytest.raises(Forbidden, match=f"trial {trial_id} belongs to alice; only alice or an "
                                        "admin can register a model from it"):
        registry.register_version(rig.store, rig.home, bob, "bobs", trial_id)
    with pytest.raises(Forbidden):
        registry.create_model(rig.store, vera, "veras")
    with pytest.raises(Conflict, match="a model named 'bobs' exists"):
        registry.create_model(rig.store, alice, "bobs")
    with pytest.raises(InvalidRequest, match="a model's name is 1 to 128"):
        registry.create_model(rig.store, alice, "no spaces")
    with pytest.raises(NotFound, match="no model named 'nope'"):
        registry.register_version(rig.store, rig.home, alice, "nope", trial_id)
    with pytest.raises(NotFound, match=f"trial {trial_id} has no intact checkpoint 'step-9'"):
        registry.register_version(rig.store, rig.home, rig.admin, "bobs", trial_id,
                                  checkpoint="step-9")
    assert registry.register_version(rig.store, rig.home, rig.admin, "bobs",
                                     trial_id)["version"] == 1

    v1 = registry.VersionRef.parse("bobs@v1")
    with pytest.raises(Forbidden, match="model bobs belongs to bob; only bob or an admin can "
                                        "change the stages of it"):
        registry.set_stage(rig.store, alice, v1, ModelStage.PRODUCTION)
    assert registry.set_stage(rig.store, bob, v1, ModelStage.STAGING)["stage"] == "staging"
    with pytest.raises(Forbidden, match="user bob cannot delete registered models"):
        registry.delete_version(rig.store, bob, v1)
    with pytest.raises(InvalidRequest, match="write NAME, NAME@3, NAME@production"):
        registry.VersionRef.parse("bobs@best")
    with pytest.raises(NotFound, match="model bobs has no version bobs@production"):
        registry.describe_version(rig.store, registry.VersionRef.parse("bobs@production"))


def test_a_registered_checkpoint_outlives_gc_and_holds_its_experiment(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    """Five checkpoints, the policy keeps the latest and the best (steps 5 and 2); the one
    of step 3, registered, is kept too, and says why; the experiment cannot be deleted while
    the registry holds it."""
    rig = sqlite_rig
    config = {"name": "ckpt", "harness": True,
              "entrypoint": [sys.executable, str(FIXTURES / "checkpoint_series.py"),
                             "0.5,0.2,0.4,0.3,0.6"],
              "searcher": {"name": "single", "metric": "val_loss"},
              "checkpoint_storage": {"type": "shared_fs", "path": str(tmp_path / "storage")}}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    assert rig.run_to_end_of(experiment_id, trial_id).state == "SUCCEEDED"
    with rig.store.session_scope() as s:
        third = s.scalars(select(Checkpoint.name).where(Checkpoint.trial_id == trial_id,
                                                         Checkpoint.step == 3)).one()
    registry.create_model(rig.store, rig.admin, "series")
    registry.register_version(rig.store, rig.home, rig.admin, "series", trial_id,
                              checkpoint=third, accept_unverified="a fixture: no plan")

    worker = StorageWorker(rig.store, rig.home)
    for _ in range(50):
        if not worker.run_once():
            break

    with rig.store.session_scope() as s:
        kept = {c.step: (c.state, c.gc_reason) for c in s.scalars(
            select(Checkpoint).where(Checkpoint.trial_id == trial_id))}
    assert {step: state for step, (state, _) in kept.items()} == {
        1: "deleted", 2: "stored", 3: "stored", 4: "deleted", 5: "stored"}
    assert kept[3][1] == "registered as series v1: the registry holds it"
    with pytest.raises(Conflict, match=f"experiment {experiment_id} holds the checkpoints of "
                                       f"series v1 \\(trial {trial_id}\\)"):
        retention.delete_experiment(rig.store, None, rig.admin, experiment_id)

    # The version deleted, nothing pins the checkpoint: the next collection removes it.
    registry.delete_version(rig.store, rig.admin, registry.VersionRef.parse("series@1"))
    retention.collect(rig.store, worker, rig.admin, experiment_id, {}, dry_run=False)
    for _ in range(50):
        if not worker.run_once():
            break
    with rig.store.session_scope() as s:
        assert s.scalars(select(Checkpoint.state).where(Checkpoint.trial_id == trial_id,
                                                        Checkpoint.step == 3)).one() == "deleted"
    retention.delete_experiment(rig.store, None, rig.admin, experiment_id)

