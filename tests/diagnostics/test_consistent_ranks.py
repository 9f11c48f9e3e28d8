"""Ranks of one attempt that ran on different libraries or numerics settings: the
`consistent_ranks` check names the difference and the rank; SUSPECT by default, a warning
with `verify.consistent_ranks: warn`. Simulated as the issue asks, by one rank's own
environment (rank 1 changes OMP_NUM_THREADS before `init()`)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.services.experiments import create_experiment, describe_trial
from muster.store import Trial
from tests.supervise.conftest import Rig

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]

SCRIPT = """
import os, time, muster.harness as mh
if os.environ["RANK"] == "1" and os.environ.get("DRIFT"):
    os.environ["OMP_NUM_THREADS"] = "4"
with mh.init() as ctx:
    ctx.report_training(0, {"loss": 1.0})
    deadline = time.monotonic() + 60  # until the test has seen what it waits for
    while not os.path.exists(os.environ["RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.02)
"""
PASSES_RUNNING = 5  # supervisor passes a RUNNING trial gets before its ranks are let go


def _check(rig: Rig, drift: bool, mode: str | None
           ) -> tuple[str, dict[str, Any], list[str | None]]:
    release = rig.home.root / f"release-{drift}-{mode}"
    variables = {"OMP_NUM_THREADS": "1", "RELEASE": str(release),
                 **({"DRIFT": "1"} if drift else {})}
    verify: dict[str, Any] = {"require_checkpoint": False, "require_metrics": ["loss"]}
    if mode is not None:
        verify["consistent_ranks"] = mode
    config = {"name": "ranks", "harness": True, "entrypoint": [sys.executable, "-c", SCRIPT],
              "failure_policy": {"stop_grace": 1.0}, "resources": {"replicas": 2},
              "environment": {"variables": variables}, "verify": verify}
    experiment_id = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                      archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    # The ranks wait until the warning is there (drift), or until the trial has been
    # RUNNING for a few passes, in which the comparison had its chance (no drift).
    passes = 0

    def compared() -> bool:
        nonlocal passes
        view = rig.trial(trial_id)
        passes += view.state == "RUNNING"
        return any(e.reason == "ranks differ" for e in view.events) or (
            not drift and passes >= PASSES_RUNNING)

    rig.tick_until(compared, what=f"trial {trial_id}'s ranks to be compared")
    release.touch()
    state = rig.tick_until(  # a SUSPECT trial waits for a review: its experiment goes on
        lambda: (t := rig.trial(trial_id).state) in ("SUCCEEDED", "SUSPECT", "FAILED") and t,
        what=f"trial {trial_id} to settle")
    trial = describe_trial(rig.store, trial_id)
    [check] = [c for c in trial["verification"]["checks"] if c["name"] == "consistent_ranks"]
    warnings = [e.message for e in rig.trial(trial_id).events if e.reason == "ranks differ"]
    return state, check, warnings


@pytest.mark.parametrize(("drift", "mode", "state", "passed"), [
    (False, None, "SUCCEEDED", True),
    (True, None, "SUSPECT", False),
    (True, "warn", "SUCCEEDED", True),
], ids=["same", "drift-suspect", "drift-warn"])
def test_ranks_that_ran_differently_are_named(sqlite_rig: Rig, drift: bool, mode: str | None,
                                              state: str, passed: bool) -> None:
    got_state, check, warnings = _check(sqlite_rig, drift, mode)
    assert (got_state, check["passed"]) == (state, passed), check
    if not drift:
        assert check["detail"].startswith("2 ranks: the same libraries")
        assert warnings == []
    else:
        assert "OMP_NUM_THREADS: 1 vs 4 (rank 1)" in check["detail"]
        # Said at start too, once, as a warning event on the attempt.
        [warning] = warnings
        assert warning is not None and warning.startswith("warning: 2 ranks differ")
        assert "OMP_NUM_THREADS" in warning
        assert check["detail"].startswith("warning: " if mode == "warn" else "2 ranks differ")
