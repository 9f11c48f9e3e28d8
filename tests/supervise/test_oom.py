"""Running out of memory, end to end: a trial whose replica crosses `resources.memory_limit`
(or raises MemoryError) fails at once as OOM: a retry would run out of memory the same way."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.services.experiments import create_experiment
from muster.states import ExperimentState
from muster.store import Trial
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(90)]

NOT_RETRIED = (
    "OOM failure; not retried, since it would run out of memory the same way "
    "(raise resources.memory_limit or use less memory)"
)
# Budgets that would retry anything else, to show that OOM does not touch them.
GENEROUS = {"retry_user_errors": 3, "trial_retries": 3, "replica_restarts": 3}


def submit(rig: Rig, entrypoint: list[str], resources: dict[str, Any]) -> Submitted:
    config = {
        "name": "oom-test",
        "entrypoint": entrypoint,
        "resources": resources,
        "failure_policy": {"stop_grace": 1.0, **GENEROUS},
    }
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump(config), archive=None)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id)).one()
    return Submitted(experiment_id, trial_id)


def test_a_replica_over_its_memory_limit_fails_the_trial_at_once(rig: Rig) -> None:
    job = submit(rig, fixture_entrypoint("memory_hog.py", "hog", "600"),
                 {"memory_limit": "150MiB"})
    trial = rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("FAILED", "OOM")
    assert rig.experiment_state(job.experiment_id) is ExperimentState.ERROR
    [attempt] = trial.attempts
    assert (attempt.state, attempt.reason, attempt.replica_reason) == ("FAILED", "OOM", "OOM")
    assert (attempt.exit_code, attempt.signal) == (137, "SIGKILL")
    assert trial.counters == (0, 0, 0, 0)
    assert attempt.message is not None
    match = re.fullmatch(
        r"The replica worker-0 \(rank 0\) ran out of memory and exited with a non-zero status "
        r"of 137 \(limit 150 MiB, peak (?P<peak>[\d.]+) MiB\)",
        attempt.message,
    )
    assert match, attempt.message
    assert float(match["peak"]) >= 150
    assert trial.message == attempt.message
    assert [(e.reason, e.message) for e in trial.decisions()] == [("OOM", NOT_RETRIED)]
    assert trial.trial_moves()[-1] == ("RUNNING", "FAILED", "OOM")


def test_a_memory_error_fails_the_trial_as_oom(sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, fixture_entrypoint("memory_hog.py", "memory-error"), {})
    trial = sqlite_rig.run_to_end(job)

    assert (trial.state, trial.reason, trial.counters) == ("FAILED", "OOM", (0, 0, 0, 0))
    [attempt] = trial.attempts
    assert (attempt.exit_code, attempt.replica_reason) == (1, "OOM")
    assert attempt.message is not None
    assert attempt.message.startswith(
        "The replica worker-0 (rank 0) ran out of memory and exited with a non-zero status "
        "of 1. Termination reason: MemoryError (see the last "
    )
    assert [(e.reason, e.message) for e in trial.decisions()] == [("OOM", NOT_RETRIED)]


def test_a_replica_within_its_memory_limit_succeeds(sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, fixture_entrypoint("memory_hog.py", "within", "20"),
                 {"memory_limit": "150MiB"})
    trial = sqlite_rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
