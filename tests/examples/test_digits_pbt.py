"""examples/digits/pbt.yaml, smaller (2 members, 2 rounds of 2 epochs), run for real with
the example's own train.py: every round verified; a member of the second round resumed its
parent's weights at the parent's epoch and trained with its own learning rate (the
optimizer's state it loaded had the parent's), and its width stayed the parent's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.services.experiments import describe_experiment
from muster.store import Checkpoint
from tests.examples.test_ddp import EXAMPLE, NEEDS, copy_context, digits
from tests.examples.test_digits_search import SEARCH_TIMEOUT, _submit
from tests.supervise.conftest import Rig

torch = pytest.importorskip("torch", reason=NEEDS)
pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(400)]

__all__ = ["digits"]  # the module's PNG files, made once


def _small_pbt() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((EXAMPLE / "pbt.yaml").read_text())
    config["searcher"] |= {"population_size": 2, "num_rounds": 2, "length_per_round": 2,
                           "replace_function": {"truncate_fraction": 0.5},
                           "explore_function": {"resample_probability": 0.0,
                                                "perturb_factor": 0.2,
                                                "hyperparameters": ["lr", "dropout"]}}
    config["failure_policy"]["heartbeat_timeout"] = "200s"
    return config


def test_the_example_trains_on_from_its_parents_checkpoint_with_its_own_rate(
        sqlite_rig: Rig, tmp_path: Path, digits: Path) -> None:
    context = copy_context(tmp_path, digits, ("train.py",))
    experiment_id = _submit(sqlite_rig, _small_pbt(), context)
    sqlite_rig.tick_until(lambda: sqlite_rig.experiment_state(experiment_id).is_terminal(),
                          what="the digits PBT to end", timeout=SEARCH_TIMEOUT)
    experiment = describe_experiment(sqlite_rig.store, experiment_id)
    assert experiment["state"] == "COMPLETED", experiment
    trials = {t["number"]: t for t in experiment["trials"]}
    assert sorted(trials) == [0, 1, 2, 3]
    assert all(t["state"] == "SUCCEEDED" and t["verified"] for t in trials.values()), [
        (t["state"], t["verdict"]) for t in trials.values()]
    with sqlite_rig.store.session_scope() as s:
        rows = {t: s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trials[t]["id"])
                             .order_by(Checkpoint.step)).all() for t in trials}
        saved = {t: [(c.step, Path(c.path)) for c in found] for t, found in rows.items()}
    exploits = 0
    for number in (2, 3):
        trial = trials[number]
        lineage = _lineage(sqlite_rig, trial["id"])
        parent = trials[lineage["parent"]]
        assert [step for step, _ in saved[number]] == [3, 4]  # epochs 3 and 4: resumed at 2
        assert trial["hparams"]["hidden"] == parent["hparams"]["hidden"]  # never explored
        last = torch.load(saved[number][-1][1] / "state.pt")
        assert last["epoch"] == 4
        assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(
            trial["hparams"]["lr"])  # its own rate, not the parent's it loaded
        if lineage["action"] == "exploit":
            exploits += 1
            assert trial["hparams"]["lr"] != parent["hparams"]["lr"]
    assert exploits == 1  # half of two


def _lineage(rig: Rig, trial_id: int) -> dict[str, Any]:
    from muster.store import Trial

    with rig.store.session_scope() as s:
        found: dict[str, Any] = s.get_one(Trial, trial_id).search_state["pbt"]
        return found
