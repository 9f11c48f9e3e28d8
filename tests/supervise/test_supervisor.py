"""The supervisor end to end: real store, real shims, real fixture scripts, `tick()` by hand.

Each exit class is followed from the script's end to the trial's state, its attempts, its
budget counters and the events that explain every decision.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.local_placement import LocalPlacement
from muster.services.experiments import kill_experiment
from muster.states import ExperimentState, TrialState
from muster.store import Attempt, Store
from muster.supervise.policy import INTERNAL_FAILURE_MESSAGE
from muster.supervise.supervisor import Supervisor
from tests.accounts import first_admin
from tests.processes import live_group
from tests.supervise.conftest import BACKENDS, Rig, TrialView, backend_rig, fixture_entrypoint
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]


@pytest.fixture(params=BACKENDS)
def rig(request: pytest.FixtureRequest, store: Store, home: Home) -> Rig:
    """The lifecycle contract: every test here runs on each launcher backend."""
    return backend_rig(request.param, store, home)


@pytest.fixture(params=BACKENDS)
def sqlite_rig(request: pytest.FixtureRequest, sqlite_store: Store, home: Home) -> Rig:
    return backend_rig(request.param, sqlite_store, home)


def _log(view: TrialView, number: int) -> bytes:
    return (view.attempts[number - 1].run_dir / "rank-0.log").read_bytes()


@pytest.mark.timeout(60)
def test_exit_0_succeeds_with_one_attempt_and_its_events(rig: Rig) -> None:
    job = rig.submit(fixture_entrypoint("exit0.sh"))
    trial = rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    assert rig.experiment_state(job.experiment_id) is ExperimentState.COMPLETED
    [attempt] = trial.attempts
    assert (attempt.number, attempt.state, attempt.replica_reason) == (1, "SUCCEEDED", "OK")
    assert (attempt.exit_code, attempt.signal) == (0, None)
    assert trial.counters == (0, 0, 0, 0)
    assert _log(trial, 1) == b"hello from exit0\n"
    assert trial.trial_moves() == [
        ("QUEUED", "STARTING", "launching"),
        ("STARTING", "RUNNING", "started"),
        ("RUNNING", "SUCCEEDED", "OK"),
    ]
    assert [(e.from_state, e.to_state, e.reason) for e in trial.events_of(attempt)] == [
        ("STARTING", "RUNNING", "started"),
        ("RUNNING", "SUCCEEDED", "OK"),
    ]
    assert all(e.actor == "system:supervisor" for e in trial.events if e.reason != "created")


@pytest.mark.timeout(60)
def test_a_start_and_an_end_between_two_passes_are_recorded_by_one(rig: Rig) -> None:
    """A child that starts and exits before the next pass: that pass records its start
    (the process, the "started" moves) and its end together, in order."""
    job = rig.submit(fixture_entrypoint("exit0.sh"))
    rig.tick_until(lambda: rig.trial(job.trial_id).attempts, what="the launch")
    run_dir = rig.trial(job.trial_id).attempts[0].run_dir
    wait_until(lambda: (run_dir / "rank-0.exit.json").exists(), what="the exit record")
    assert rig.trial(job.trial_id).state == "STARTING"  # no pass has looked since
    rig.supervisor.tick()
    trial = rig.trial(job.trial_id)
    assert (trial.state, trial.reason) == ("SUCCEEDED", "OK")
    [attempt] = trial.attempts
    assert trial.trial_moves() == [
        ("QUEUED", "STARTING", "launching"),
        ("STARTING", "RUNNING", "started"),
        ("RUNNING", "SUCCEEDED", "OK"),
    ]
    assert [(e.from_state, e.to_state, e.message) for e in trial.events_of(attempt)] == [
        ("STARTING", "RUNNING", "started"),
        ("RUNNING", "SUCCEEDED", attempt.message),
    ]
    with rig.store.session_scope() as s:
        replica = s.get_one(Attempt, attempt.id).replicas[0]
        # The training process the shim published, as a pass that saw it running notes it.
        exit_record = json.loads((run_dir / "rank-0.exit.json").read_text())
        assert (replica.pid, replica.started_at) == (exit_record["pid"],
                                                     exit_record["started_at"])


# (fixture and its arguments, failure_policy, trial reason, attempts, counters as
#  (replica_restarts, trial_retries, internal_retries, user_error_retries),
#  the decision messages in order, the last one being the give-up)
POLICY_TABLE: list[Any] = [
    pytest.param(
        ("fail_traceback.py",), {}, "USER_ERROR", 1, (0, 0, 0, 0),
        ["USER_ERROR failure; not retried (retry_user_errors is 0)"],
        id="user-error",
    ),
    pytest.param(
        ("fail_traceback.py",), {"retry_user_errors": 1}, "USER_ERROR", 2, (0, 0, 0, 1),
        ["USER_ERROR failure; retrying the trial (retry 1 of 1)",
         "USER_ERROR failure; giving up after 1 retry"],
        id="user-error-retried",
    ),
    pytest.param(
        ("exit2.sh",), {"retry_user_errors": 3}, "PERMANENT_ERROR", 1, (0, 0, 0, 0),
        ["PERMANENT_ERROR failure; not retried, since a retry would fail the same way"],
        id="permanent",
    ),
    pytest.param(
        ("kill_self.py", "SIGSEGV"), {}, "TRANSIENT", 4, (0, 3, 0, 0),
        [*(f"TRANSIENT failure; retrying the trial (retry {n} of 3)" for n in (1, 2, 3)),
         "TRANSIENT failure; giving up after 3 retries"],
        id="transient-sigsegv",
    ),
    pytest.param(
        ("exit_with.sh", "3"), {"transient_exit_codes": [3], "trial_retries": 1},
        "TRANSIENT", 2, (0, 1, 0, 0),
        ["TRANSIENT failure; retrying the trial (retry 1 of 1)",
         "TRANSIENT failure; giving up after 1 retry"],
        id="transient-exit-code",
    ),
    pytest.param(
        ("exit_with.sh", "3"), {"trial_retries": 1}, "USER_ERROR", 1, (0, 0, 0, 0),
        ["USER_ERROR failure; not retried (retry_user_errors is 0)"],
        id="exit-code-not-listed",
    ),
    pytest.param(
        ("kill_self.py", "SIGKILL"), {"replica_restarts": 2, "trial_retries": 1},
        "INFRA", 4, (2, 1, 0, 0),
        ["INFRA failure; restarting the trial's replicas (restart 1 of 2)",
         "INFRA failure; restarting the trial's replicas (restart 2 of 2)",
         "INFRA failure; retrying the trial (retry 1 of 1)",
         "INFRA failure; giving up after 2 replica restarts and 1 trial retry"],
        id="infra-sigkill",
    ),
]


@pytest.mark.parametrize(
    ("script", "policy", "reason", "attempts", "counters", "decisions"), POLICY_TABLE
)
def test_failure_policy_end_to_end(
    sqlite_rig: Rig,
    script: tuple[str, ...],
    policy: dict[str, Any],
    reason: str,
    attempts: int,
    counters: tuple[int, int, int, int],
    decisions: list[str],
) -> None:
    job = sqlite_rig.submit(fixture_entrypoint(*script), **policy)
    trial = sqlite_rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("FAILED", reason)
    assert sqlite_rig.experiment_state(job.experiment_id) is ExperimentState.ERROR
    assert [a.number for a in trial.attempts] == list(range(1, attempts + 1))
    for attempt in trial.attempts:
        assert (attempt.state, attempt.reason, attempt.replica_reason) == (
            "FAILED", reason, reason
        )
        assert attempt.message is not None and "non-zero status" in attempt.message
    assert trial.counters == counters
    assert trial.message == trial.attempts[-1].message  # the last end explains the failure
    assert [(e.reason, e.message) for e in trial.decisions()] == [
        (reason, message) for message in decisions
    ]
    restarts = [m for m in trial.trial_moves() if m[1] == "RESTARTING"]
    assert restarts == [("RUNNING", "RESTARTING", reason)] * (attempts - 1)
    assert trial.trial_moves()[-1] == ("RUNNING", "FAILED", reason)


def test_a_traceback_names_its_exception(sqlite_rig: Rig) -> None:
    trial = sqlite_rig.run_to_end(sqlite_rig.submit(fixture_entrypoint("fail_traceback.py")))
    assert trial.message == (
        "The replica worker-0 (rank 0) exited with a non-zero status of 1. Termination "
        "reason: ValueError: bad shape (see the last 5 log lines)"
    )


def test_signals_are_named_on_the_replica(sqlite_rig: Rig) -> None:
    trial = sqlite_rig.run_to_end(
        sqlite_rig.submit(fixture_entrypoint("kill_self.py", "SIGSEGV"), trial_retries=0)
    )
    [attempt] = trial.attempts
    assert (attempt.exit_code, attempt.signal) == (139, "SIGSEGV")
    assert _log(trial, 1) == b"about to raise SIGSEGV\n"


@pytest.fixture
def blocked_home(tmp_path: Path) -> Home:
    """A home whose runs/ is a regular file, so no attempt directory can be made in it."""
    home = Home(tmp_path / "blocked-home").ensure()
    home.runs_dir.rmdir()
    home.runs_dir.write_text("not a directory\n")
    return home


def test_a_launch_that_cannot_happen_is_internal_and_gives_up_after_3_attempts(
    sqlite_store: Store, blocked_home: Home
) -> None:
    rig = Rig(sqlite_store, blocked_home, Supervisor(sqlite_store, LocalLauncher(), blocked_home,
                                                      LocalPlacement(sqlite_store),
                                                      min_free_disk=0),
              first_admin(sqlite_store, blocked_home))
    job = rig.submit(fixture_entrypoint("exit0.sh"))
    trial = rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("FAILED", "INTERNAL")
    assert trial.message is not None
    assert trial.message.startswith(f"{INTERNAL_FAILURE_MESSAGE}: muster could not launch")
    assert [(a.number, a.state, a.replica_reason) for a in trial.attempts] == [
        (n, "FAILED", "INTERNAL") for n in (1, 2, 3)
    ]
    assert all(a.shim_pid is None for a in trial.attempts)  # nothing was started
    assert trial.counters == (0, 0, 2, 0)
    assert [(e.reason, e.message) for e in trial.decisions()] == [
        ("INTERNAL", "INTERNAL failure; retrying the attempt (retry 1 of 2)"),
        ("INTERNAL", "INTERNAL failure; retrying the attempt (retry 2 of 2)"),
        ("INTERNAL", INTERNAL_FAILURE_MESSAGE),
    ]
    # An attempt that never ran never became RUNNING; nor did its trial.
    assert ("STARTING", "RUNNING", "started") not in trial.trial_moves()
    assert rig.experiment_state(job.experiment_id) is ExperimentState.ERROR


@pytest.mark.timeout(60)
def test_one_slot_runs_trials_one_at_a_time(rig: Rig, tmp_path: Path) -> None:
    rig.set_slots(1)
    releases = [tmp_path / "release-1", tmp_path / "release-2"]
    jobs = [rig.submit(fixture_entrypoint("wait_for_file.py", str(r))) for r in releases]
    most_at_once = 0

    def busy() -> int:
        active = [rig.trial(j.trial_id).state for j in jobs]
        return sum(TrialState(s).is_active() for s in active)

    def tick_and_count(predicate: Any, what: str) -> None:
        def step() -> Any:
            nonlocal most_at_once
            rig.supervisor.tick()
            most_at_once = max(most_at_once, busy())
            return predicate()

        wait_until(step, timeout=60, what=what)

    tick_and_count(lambda: rig.trial(jobs[0].trial_id).state == "RUNNING", "trial 1 running")
    for _ in range(5):  # more passes change nothing: the one slot is taken
        rig.supervisor.tick()
    second = rig.trial(jobs[1].trial_id)
    assert (second.state, second.attempts) == ("QUEUED", [])

    releases[0].touch()
    tick_and_count(lambda: rig.trial(jobs[1].trial_id).state == "RUNNING", "trial 2 running")
    assert rig.trial(jobs[0].trial_id).state == "SUCCEEDED"
    releases[1].touch()
    tick_and_count(lambda: rig.experiment_state(jobs[1].experiment_id).is_terminal(),
                   "experiment 2 to end")
    assert [rig.trial(j.trial_id).state for j in jobs] == ["SUCCEEDED", "SUCCEEDED"]
    assert most_at_once == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("script", "signal_name"),
    [("wait_for_file.py", "SIGTERM"), ("ignore_term.py", "SIGKILL")],
    ids=["ends-on-sigterm", "ignores-sigterm"],
)
def test_kill_while_running_cancels_the_trial(
    rig: Rig, tmp_path: Path, script: str, signal_name: str
) -> None:
    job = rig.submit(fixture_entrypoint(script, str(tmp_path / "file")))
    running = rig.until_trial(job, TrialState.RUNNING)
    log = running.attempts[0].run_dir / "rank-0.log"
    wait_until(lambda: log.exists() and log.read_bytes(), what="the script's first line")

    kill_experiment(rig.store, rig.admin, job.experiment_id)
    trial = rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("CANCELED", "killed")
    assert rig.experiment_state(job.experiment_id) is ExperimentState.CANCELED
    [attempt] = trial.attempts
    assert (attempt.state, attempt.reason, attempt.replica_reason) == (
        "CANCELED", "STOPPED", "STOPPED"
    )
    assert attempt.signal == signal_name
    assert attempt.message == f"The replica worker-0 (rank 0) was stopped by muster ({signal_name})"
    assert trial.counters == (0, 0, 0, 0)
    assert trial.decisions() == []  # a requested stop is not a failure to decide about
    status = rig.supervisor.launcher.describe(attempt.run_dir, 0)
    assert status.child is not None and live_group(status.child.pid) == []


@pytest.mark.timeout(60)
def test_kill_while_restarting_starts_no_new_attempt(rig: Rig) -> None:
    job = rig.submit(fixture_entrypoint("kill_self.py", "SIGSEGV"))
    rig.supervisor.tick()  # admits the trial: attempt 1 starts
    assert [a.number for a in rig.trial(job.trial_id).attempts] == [1]

    def reconciled_only() -> bool:  # reconcile without launching, to catch it between attempts
        for attempt_id in rig.supervisor.active_attempt_ids():
            rig.supervisor.reconcile_attempt(attempt_id)
        return rig.trial(job.trial_id).state == "RESTARTING"

    wait_until(reconciled_only, timeout=30, what="the trial to be RESTARTING")
    kill_experiment(rig.store, rig.admin, job.experiment_id)
    trial = rig.run_to_end(job)

    assert (trial.state, trial.reason) == ("CANCELED", "killed")
    assert [(a.number, a.state, a.replica_reason) for a in trial.attempts] == [
        (1, "FAILED", "TRANSIENT")
    ]
    assert trial.trial_moves()[-1] == ("RESTARTING", "CANCELED", "killed")
    assert rig.experiment_state(job.experiment_id) is ExperimentState.CANCELED


def test_kill_while_queued_cancels_at_once(rig: Rig) -> None:
    rig.set_slots(0)
    job = rig.submit(fixture_entrypoint("exit0.sh"))
    rig.supervisor.tick()
    kill_experiment(rig.store, rig.admin, job.experiment_id)
    trial = rig.run_to_end(job)
    assert (trial.state, trial.reason, trial.attempts) == ("CANCELED", "killed", [])
