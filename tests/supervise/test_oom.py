"""Running out of memory, end to end: a trial whose replica crosses `resources.memory_limit`,
is killed by the kernel's OOM killer without one, or raises MemoryError fails at once as
OOM (a retry would run out of memory the same way), unless `failure_policy.oom_retries`
allows retries; either way its peak memory is recorded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from rich.console import Console
from sqlalchemy import select

from muster.cli import render
from muster.home import Home
from muster.schedule.local_placement import LocalPlacement
from muster.server import api
from muster.services.experiments import create_experiment, describe_trial
from muster.sizes import format_size
from muster.states import ExperimentState
from muster.store import Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import first_admin
from tests.cgroups import LauncherInCgroup, memory_cgroup, needs_cgroup
from tests.processes import kill_home_processes
from tests.supervise.conftest import Rig, Submitted, fixture_entrypoint

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(90)]

NOT_RETRIED = (
    "OOM failure; not retried (oom_retries is 0), since a retry would run out of memory the "
    "same way"
)
# Budgets that would retry anything else, to show that OOM does not touch them.
GENEROUS = {"retry_user_errors": 3, "trial_retries": 3, "replica_restarts": 3}


def submit(rig: Rig, entrypoint: list[str], resources: dict[str, Any],
           **policy: Any) -> Submitted:
    config = {
        "name": "oom-test",
        "entrypoint": entrypoint,
        "resources": resources,
        "failure_policy": {"stop_grace": 1.0, **GENEROUS, **policy},
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
        r"of 137: killed by the kernel's OOM killer at its memory_limit of 150 MiB \(peak "
        r"(?P<peak>[\d.]+) MiB\): raise resources\.memory_limit or use less memory",
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


# -- the kernel's OOM killer, without a memory_limit ------------------------------------------

MiB = 1 << 20
CGROUP_LIMIT = 200 * MiB  # the test's cgroup, which the shims run in: no muster limit at all
KERNEL_OOM = re.compile(
    r"The replica worker-0 \(rank 0\) ran out of memory and exited with a non-zero status "
    r"of 137: killed by the kernel's OOM killer at [\d.]+ MiB \(machine [\d.]+ GiB, no "
    r"memory_limit set\): set resources\.memory_limit or use less memory"
)


@pytest.fixture
def cgroup_rig(store: Store, home: Home, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    """A supervisor whose replicas' shims run inside a 200 MiB memory cgroup of the test's."""
    monkeypatch.setenv("MUSTER_SHIM_FORKSERVER", "0")  # the fork server runs outside it
    with memory_cgroup(CGROUP_LIMIT, "trial") as cgroup:
        supervisor = Supervisor(store, LauncherInCgroup(cgroup), home,
                                LocalPlacement(store, slots=4), min_free_disk=0)
        yield Rig(store, home, supervisor, first_admin(store, home))
        kill_home_processes(home.root)  # before the cgroup goes: it must be empty


def replicas_of(store: Store, trial_id: int) -> list[tuple[int, int, str | None, int | None,
                                                           str | None, int | None]]:
    """(attempt, incarnation, reason, peak_rss_bytes, oom_source, oom_limit_bytes) of each
    replica row of the trial."""
    with store.session_scope() as s:
        trial = s.get_one(Trial, trial_id)
        return [(a.number, r.incarnation, r.reason, r.peak_rss_bytes, r.oom_source,
                 r.oom_limit_bytes) for a in trial.attempts for r in a.replicas]


@needs_cgroup
def test_a_kernel_oom_kill_without_a_limit_fails_the_trial_after_one_attempt(
    cgroup_rig: Rig,
) -> None:
    job = submit(cgroup_rig, fixture_entrypoint("memory_hog.py", "hog", "600"), {})
    trial = cgroup_rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("FAILED", "OOM")
    [attempt] = trial.attempts  # not retried, not restarted: one attempt
    assert (attempt.state, attempt.replica_reason, attempt.exit_code) == ("FAILED", "OOM", 137)
    assert trial.counters == (0, 0, 0, 0)
    assert attempt.message is not None and KERNEL_OOM.fullmatch(attempt.message), \
        attempt.message
    assert trial.message == attempt.message
    assert [(e.reason, e.message) for e in trial.decisions()] == [("OOM", NOT_RETRIED)]
    [(number, incarnation, reason, peak, source, limit)] = replicas_of(cgroup_rig.store,
                                                                       job.trial_id)
    assert (number, incarnation, reason, source, limit) == (1, 0, "OOM", "cgroup", None)
    assert peak is not None and 100 * MiB <= peak <= CGROUP_LIMIT

    # The replica JSON (the API's contract), `muster trial describe` and its table.
    view = api.TrialDescription.model_validate(describe_trial(cgroup_rig.store, job.trial_id))
    [replica] = view.attempts[0].replicas
    assert (replica.peak_rss_bytes, replica.oom) == (peak, api.OomView(source="cgroup",
                                                                       limit_bytes=None))
    console = Console(record=True, width=250)
    console.print(render.attempts_table(view.model_dump()))
    table = console.export_text()
    assert "OOM (cgroup)" in table and format_size(peak) in table


@needs_cgroup
def test_oom_retries_allows_a_retry_of_an_oom_kill(cgroup_rig: Rig) -> None:
    job = submit(cgroup_rig, fixture_entrypoint("memory_hog.py", "hog", "600"), {},
                 oom_retries=1)
    trial = cgroup_rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("FAILED", "OOM")
    assert [(a.number, a.replica_reason) for a in trial.attempts] == [(1, "OOM"), (2, "OOM")]
    assert trial.counters == (0, 0, 0, 0)  # no other budget was touched
    assert [(e.reason, e.message) for e in trial.decisions()] == [
        ("OOM", "OOM failure; retrying the trial (retry 1 of 1)"),
        ("OOM", "OOM failure; giving up after 1 retry"),
    ]


@needs_cgroup
def test_an_oom_kill_is_not_restarted_in_place(cgroup_rig: Rig) -> None:
    job = submit(cgroup_rig, fixture_entrypoint("memory_hog.py", "hog", "600"), {},
                 restart_scope="replica")
    trial = cgroup_rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("FAILED", "OOM")
    assert [(number, incarnation, reason) for number, incarnation, reason, *_ in
            replicas_of(cgroup_rig.store, job.trial_id)] == [(1, 0, "OOM")]
    assert trial.counters == (0, 0, 0, 0)


def test_an_ordinary_trial_has_its_peak_recorded(sqlite_rig: Rig) -> None:
    job = submit(sqlite_rig, fixture_entrypoint("memory_hog.py", "within", "40"), {})
    trial = sqlite_rig.run_to_end(job)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    [(_, _, reason, peak, source, limit)] = replicas_of(sqlite_rig.store, job.trial_id)
    assert (reason, source, limit) == ("OK", None, None)
    assert peak is not None and peak > 0
    view = api.TrialDescription.model_validate(describe_trial(sqlite_rig.store, job.trial_id))
    assert view.attempts[0].replicas[0].peak_rss_bytes == peak

