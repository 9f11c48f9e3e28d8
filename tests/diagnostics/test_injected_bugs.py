"""The injected-bug suite (issue 17): 2-rank DDP runs on gloo that each exit 0 with one
coded bias in them (tests/fixtures/bias_bugs.py), every one flagged by its check with the
ranks named; and 20 clean seeded runs of the same script with no finding at all.

All 28 trials run on one rig shared by the module (4 slots: two trials at a time), so the
suite pays for its processes once; each test then reads its trial's verdict.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from sqlalchemy import select

from muster.home import Home
from muster.services.experiments import create_experiment, describe_trial
from muster.states import TrialState
from muster.store import Store, Trial
from tests.processes import kill_home_processes
from tests.supervise.conftest import FIXTURES, Rig, _rig

pytest.importorskip("torch", reason="the injected bugs run PyTorch DDP (the examples extra)")
pytest.importorskip("sklearn", reason="the injected bugs train on scikit-learn's digits")
from sklearn.datasets import load_digits

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(600)]

CLEAN_RUNS = 20
SUITE_TIMEOUT = 540.0
# The server's interval between passes: ticking every 20 ms over 28 trials would spend a
# third of the suite's CPU on the passes, taken from the ranks.
TICK_SECONDS = 0.2

# bug -> (the trial's state, the check that finds it, words its detail must hold)
FLAGGED = {
    "no_distributed_sampler": ("SUSPECT", "diagnostics.sampler_overlap",
                               ["ranks 0 and 1 drew 100% the same samples", "RandomSampler"]),
    "same_seed": ("SUSPECT", "diagnostics.rank_seeds",
                  ["ranks 0 and 1", "WeightedRandomSampler", "same seed 0"]),
    "no_set_epoch": ("SUCCEEDED", "diagnostics.epoch_order",
                     ["warning:", "same order in passes 0 and 1", "set_epoch"]),
    "uneven": ("SUCCEEDED", "diagnostics.sample_balance",
               ["warning:", "rank 0 drew 1,344 samples, rank 1 444", "3.03x"]),
    "scaled_inputs": ("SUSPECT", "diagnostics.grad_norm_spread",
                      ["update 0: rank 1's local gradient norm"]),
    "perturbed": ("SUSPECT", "diagnostics.replica_hash",
                  ["update 20: rank 1's 0.weight differs from rank 0's"]),
    "nan_rank1": ("SUSPECT", "diagnostics.finite_all_ranks",
                  ["rank 1: reported loss was NaN at step 7", "finite on rank 0"]),
}


def _config(data: Path, *args: str) -> str:
    return yaml.safe_dump({
        "name": "injected-bias", "harness": True,
        "entrypoint": [sys.executable, str(FIXTURES / "bias_bugs.py"), "--data", str(data),
                       *args],
        "resources": {"replicas": 2},
        "environment": {"variables": {"OMP_NUM_THREADS": "1"}},
        "failure_policy": {"stop_grace": 5.0, "heartbeat_timeout": "300s"},
        # A NaN the script reports is this suite's point: finite_metrics would say it too.
        "verify": {"finite_metrics": False},
    })


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Every run's trial as `describe_trial` shows it, by name ("same_seed", "clean-7")."""
    root = tmp_path_factory.mktemp("injected")
    home = Home(root / "home").ensure()
    store = Store(f"sqlite:///{root / 'muster.db'}")
    store.upgrade()
    rig: Rig = _rig(store, home)
    # The digits once, for every rank to read without importing scikit-learn.
    digits = load_digits()
    data = root / "digits.npz"
    np.savez(data, data=digits.data, target=digits.target)
    runs = {bug: ("--bug", bug) for bug in FLAGGED}
    runs |= {f"clean-{seed}": ("--bug", "none", "--seed", str(seed))
             for seed in range(CLEAN_RUNS)}
    trials = {}
    try:
        for name, args in runs.items():
            experiment_id = create_experiment(store, home, rig.admin, _config(data, *args), None)
            with store.session_scope() as s:
                trials[name] = s.scalars(select(Trial.id).where(
                    Trial.experiment_id == experiment_id)).one()
        rig.tick_until(lambda: all(TrialState(rig.trial(t).state).is_at_rest()
                                   for t in trials.values()),
                       what="every injected-bug trial to settle", timeout=SUITE_TIMEOUT,
                       interval=TICK_SECONDS)
        yield {name: describe_trial(store, trial_id) for name, trial_id in trials.items()}
    finally:
        kill_home_processes(home.root)
        store.dispose()


def _checks(trial: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in trial["verification"]["checks"]}


@pytest.mark.parametrize("bug", sorted(FLAGGED))
def test_each_injected_bug_is_flagged_with_the_ranks_named(
    verdicts: dict[str, dict[str, Any]], bug: str
) -> None:
    state, check, words = FLAGGED[bug]
    trial = verdicts[bug]
    found = _checks(trial)
    assert trial["state"] == state, (trial["message"], found)
    assert check in found, sorted(found)
    detail = found[check]["detail"]
    assert all(word in detail for word in words), detail
    assert found[check]["passed"] is (state == "SUCCEEDED"), found[check]


def test_clean_seeded_runs_have_no_finding(verdicts: dict[str, dict[str, Any]]) -> None:
    clean = {name: trial for name, trial in verdicts.items() if name.startswith("clean-")}
    assert len(clean) == CLEAN_RUNS
    findings = {name: [c for c in _checks(trial).values()
                       if c["name"].startswith("diagnostics.")
                       and (not c["passed"] or c["detail"].startswith("warning"))]
                for name, trial in clean.items()}
    assert {name: f for name, f in findings.items() if f} == {}
    assert {trial["state"] for trial in clean.values()} == {"SUCCEEDED"}
    judged = {c["name"] for trial in clean.values() for c in _checks(trial).values()}
    assert {"diagnostics.sampler_overlap", "diagnostics.grad_norm_spread",
            "diagnostics.replica_hash", "diagnostics.finite_all_ranks"} <= judged
