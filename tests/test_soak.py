"""The chaos soak (benchmarks/soak.py, issue 37): its checks on made-up inputs, and the soak
itself, 5 minutes on SQLite with a fixed seed, as CI runs it.

The soak needs root (it mounts a tmpfs as the runs' disk, to fill it): without root its
test skips and says so, unless MUSTER_REQUIRE_SOAK=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))

import soak_checks as checks  # noqa: E402 - benchmarks/ is on the path only from here
from soak_checks import (  # noqa: E402
    EntityRow,
    EventRow,
    Fault,
    FaultKind,
    FinalProcess,
    ProcessEnd,
    ProcessInfo,
    Sample,
    TrialOutcome,
)
from soak_job import end_record, record  # noqa: E402

A, B = "100.5000", "200.6000"  # two processes' tokens: pid.start ticks
MARKER = "\n── muster: 1.2 KiB of output lost here: No space left on device ──\n".encode()


def records(token: str, numbers: range | list[int], long_bytes: int = 8192) -> bytes:
    return b"".join(record(token, n, long_bytes) for n in numbers)


# -- every record exactly once -----------------------------------------------------------


def test_a_whole_log_holds_every_record_once() -> None:
    data = records(A, range(45)) + b"epoch 1 rank 0 samples=40\n" + end_record(A, 45)
    report = checks.check_log("log", data, [ProcessEnd(A, 0)])
    assert report.problems == []
    assert (report.records, report.processes, report.cut_tails) == (45, 1, 0)
    assert report.ended == {A}
    assert report.record_bytes == len(records(A, range(45)))  # a long record (8 KiB) too


@pytest.mark.parametrize(("data", "problem"), [
    (records(A, [0, 1, 2, 2, 3]) + end_record(A, 4), "record 2 again"),
    (records(A, [0, 1, 4]) + end_record(A, 3), "records 2..3 are missing"),
    (records(A, [0, 1]) + end_record(A, 5), "its end record counts 5 records"),
    (records(A, [0, 1]) + end_record(A, 2) + records(A, [2]), "output after its end"),
    (records(A, [0])[:-9] + b"\n" + records(A, [1]), "cut short, yet more of its output"),
], ids=["duplicate", "gap", "end-count", "after-end", "cut-in-the-middle"])
def test_what_breaks_exactly_once(data: bytes, problem: str) -> None:
    report = checks.check_log("log", data)
    assert any(problem in p for p in report.problems), report.problems


def test_a_killed_process_may_stop_mid_record_and_the_next_one_goes_on() -> None:
    """A SIGKILL mid-write leaves a record cut short, glued to the next incarnation's
    first record (a restart in place appends to the same log)."""
    cut = records(A, range(40)) + records(A, [40])[:3000]
    data = cut + records(B, range(3)) + end_record(B, 3)
    report = checks.check_log("log", data, [ProcessEnd(A, -9), ProcessEnd(B, 0)])
    assert report.problems == []
    assert (report.cut_tails, report.cut_records, report.processes) == (1, 1, 2)
    assert report.ended == {B}


def test_a_gap_or_a_cut_where_the_shim_says_output_was_lost_is_allowed() -> None:
    data = (records(A, [0, 1]) + records(A, [2])[:20] + MARKER + records(A, [7, 8])
            + end_record(A, 9))
    report = checks.check_log("log", data, [ProcessEnd(A, 0)])
    assert report.problems == []
    assert (report.lost_markers, report.gaps_at_markers, report.cut_records) == (1, 1, 1)


def test_an_exit_0_needs_its_end_record_unless_output_was_lost_after_it() -> None:
    short = records(A, range(3))
    problems = checks.check_log("log", short, [ProcessEnd(A, 0)]).problems
    assert any("exited 0, but its log stops after record 2" in p for p in problems)
    assert checks.check_log("log", short + MARKER, [ProcessEnd(A, 0)]).problems == []
    assert checks.check_log("log", short, [ProcessEnd(A, -9)]).problems == []
    nothing = checks.check_log("log", b"", [ProcessEnd(A, 0)]).problems
    assert any("left no record" in p for p in nothing)


def test_an_exit_0_with_no_record_is_explained_only_by_output_its_exit_record_counts_lost() -> None:
    """A short process that ran wholly while the disk was full: every record lost, its exit
    record counts the bytes, and the shim's marker is in the log."""
    report = checks.check_log("log", MARKER, [ProcessEnd(A, 0, lost_bytes=4096)])
    assert (report.problems, report.lost_whole) == ([], 1)
    unmarked = checks.check_log("log", b"", [ProcessEnd(A, 0, lost_bytes=4096)]).problems
    assert any("no marker" in p for p in unmarked)
    uncounted = checks.check_log("log", MARKER, [ProcessEnd(A, 0)]).problems
    assert any("left no record" in p for p in uncounted)


def test_output_an_exit_record_counts_as_lost_needs_a_marker_in_the_log() -> None:
    data = records(A, range(3))
    unmarked = checks.check_log("log", data, [ProcessEnd(A, 1, lost_bytes=2355)]).problems
    assert any("counts 2,355 bytes of output lost, and no marker" in p for p in unmarked)
    assert checks.check_log("log", data + MARKER, [ProcessEnd(A, 1, lost_bytes=2355)]
                            ).problems == []


def test_records_a_process_wrote_into_the_pipe_of_its_killed_shim_are_counted() -> None:
    report = checks.check_log("log", records(A, range(5)), [], wrote={A: 7})
    assert report.problems == [] and report.lost_with_shim == 2


# -- no false success ---------------------------------------------------------------------


def trial(state: str = "SUCCEEDED", verified: bool | None = True, misbehaves: bool = False,
          final: tuple[FinalProcess, ...] = (FinalProcess(0, B, 100.0, 200.0),)
          ) -> TrialOutcome:
    return TrialOutcome(1, "u1", "soak-00001-plain", "plain", state, verified, misbehaves,
                        final)


def kill(target: str = A, kind: FaultKind = FaultKind.KILL_RANK) -> Fault:
    return Fault(kind, 150.0, trial="u1", attempt=1, rank=0, target=target)


def test_a_killed_rank_that_a_later_process_redid_may_succeed_verified() -> None:
    judged = checks.judge_trial(trial(), [kill(A)], ended=set())
    assert judged.reasons == () and judged.recovered == 1 and not judged.false_success


@pytest.mark.parametrize("kind", [FaultKind.KILL_RANK, FaultKind.KILL_SHIM,
                                  FaultKind.STOP_RANK])
def test_the_final_process_hit_and_verified_is_a_false_success(kind: FaultKind) -> None:
    judged = checks.judge_trial(trial(), [kill(B, kind)], ended=set())
    assert judged.false_success and "final attempt ran no later process" in judged.reasons[0]
    assert not checks.judge_trial(trial("SUSPECT", False), [kill(B, kind)], set()).false_success


def test_a_fault_after_its_process_wrote_its_end_record_hit_nothing() -> None:
    judged = checks.judge_trial(trial(), [kill(B)], ended={B})
    assert judged.reasons == () and judged.late == 1


def test_a_final_attempt_whose_log_lost_output_must_not_be_verified() -> None:
    lost = replace(trial(), lost_output=("rank 0: 1 marker line, 4,096 bytes lost",))
    judged = checks.judge_trials([lost], [Fault(FaultKind.FILL_DISK, 120.0, until=130.0)],
                                 set())[0]
    assert judged.false_success and "lost output: rank 0" in judged.reasons[0]
    assert not checks.judge_trials([trial()], [], set())[0].reasons


def test_a_script_built_to_fail_must_not_succeed_at_all() -> None:
    assert checks.judge_trial(trial(verified=False, misbehaves=True), [], set()).false_success
    assert not checks.judge_trial(trial("SUSPECT", False, True), [], set()).false_success


def test_a_hit_trial_succeeded_unverified_is_listed_not_failed() -> None:
    judged = checks.judge_trial(trial(verified=False), [kill(B)], set())
    assert not judged.false_success and judged.unverified_success


# -- nothing stuck, no orphans ------------------------------------------------------------


def test_unfinished_trials_are_stuck_and_suspect_ones_at_rest() -> None:
    trials = [trial(state) for state in ("RUNNING", "QUEUED", "PAUSED", "SUSPECT", "FAILED")]
    assert [t.state for t in checks.stuck_trials(trials)] == ["RUNNING", "QUEUED", "PAUSED"]


def test_orphans_are_found_by_session_and_by_replica_cgroup() -> None:
    uuid = "0a62d5cc-ceb2-4cf2-8e7f-4ad6dacd4323"
    processes = [
        ProcessInfo(11, 10, 500, ("/",), "python soak_job.py"),  # in shim 10's session
        ProcessInfo(21, 20, 100, ("/",), "sleep 1"),  # session 20 began before shim 20
        ProcessInfo(31, 30, 900, (f"/x/muster-{uuid}-a1-r0-77",), "python soak_job.py"),
        ProcessInfo(41, 40, 900, ("/x/muster-other-a1-r0-77",), "bash"),
        # pid 50 was a shim (ticks 200), then a daemon's session leader: not the shim's
        ProcessInfo(50, 50, 600, ("/",), "postgres"),
        ProcessInfo(51, 50, 700, ("/",), "postgres: idle"),
        ProcessInfo(61, 60, 800, ("/",), "python soak_job.py"),  # shim 60 is gone
    ]
    found = checks.find_orphans(processes, {10: 400, 20: 300, 50: 200, 60: 700}, [uuid])
    assert [p.pid for p in found] == [11, 31, 61]


# -- the server's growth --------------------------------------------------------------------


def test_growth_is_the_last_start_from_its_warm_up_to_its_end() -> None:
    samples = [Sample(0, 0, 100, 10), Sample(100, 0, 500, 90),  # the first start: ignored
               Sample(200, 1, 100, 20), Sample(231, 1, 150, 20, 2), Sample(400, 1, 160, 25, 6)]
    growth = checks.check_growth(samples, warm_from=230)
    assert growth is not None and (growth.warm.at, growth.end.at) == (231, 400)
    assert growth.holds and round(growth.rss_ratio, 3) == 1.067  # the pool's 4 fds apart
    assert round(growth.fd_ratio, 3) == 1.056
    assert not checks.check_growth([*samples[:-1], Sample(400, 1, 170, 20)], 230).holds
    assert not checks.check_growth([*samples[:-1], Sample(400, 1, 150, 23)], 230).holds
    assert checks.check_growth(samples[:3], warm_from=230) is None


def test_rss_growth_is_judged_on_windows_of_30_minutes_and_reported_on_shorter_ones() -> None:
    from soak_report import rss_target

    grown = checks.check_growth([Sample(0, 0, 100, 10), Sample(60, 0, 100, 10),
                                 Sample(300, 0, 115, 10)], warm_from=60)
    assert grown is not None and not grown.holds
    judged = rss_target(grown, 60)
    assert (judged.met, judged.measured) == (False, "+15.0%")
    reported = rss_target(grown, 5)
    assert reported.met and reported.measured.startswith("+15.0% (reported, not judged")


# -- the state machine ----------------------------------------------------------------------


def event(number: int, entity: str, from_: str | None, to: str | None,
          reason: str = "started", actor: str = "system:supervisor") -> EventRow:
    return EventRow(number, entity, 7, from_, to, reason, actor)


LEGAL = [event(1, "trial", None, None, "created"), event(2, "trial", "QUEUED", "STARTING"),
         event(3, "trial", "STARTING", "RUNNING"), event(4, "trial", "RUNNING", "SUCCEEDED")]


def test_a_legal_chain_to_the_rows_state_holds() -> None:
    report = checks.check_state_machine(LEGAL, [EntityRow("trial", 7, "SUCCEEDED", 1)])
    assert report.violations == [] and (report.entities, report.transitions) == (1, 3)


@pytest.mark.parametrize(("events", "state", "problem"), [
    ([*LEGAL[:2], event(3, "trial", "STARTING", "SUCCEEDED")], "SUCCEEDED", "not a legal"),
    ([*LEGAL[:2], event(3, "trial", "RUNNING", "SUCCEEDED")], "SUCCEEDED", "but it was"),
    (LEGAL, "FAILED", "its row says FAILED"),
    ([*LEGAL[:3], event(4, "trial", "RUNNING", "SUSPECT"),
      event(5, "trial", "SUSPECT", "SUCCEEDED", "started", "alice")], "SUCCEEDED",
     "without a review"),
    (LEGAL[:3], "RUNNING", "still RUNNING"),
], ids=["illegal", "broken-chain", "row", "review", "unfinished"])
def test_what_breaks_the_state_machine(events: list[EventRow], state: str,
                                       problem: str) -> None:
    report = checks.check_state_machine(events, [EntityRow("trial", 7, state, 1)])
    assert any(problem in v for v in report.violations), report.violations


def test_an_ended_trial_with_a_live_attempt_is_a_violation() -> None:
    rows = [EntityRow("trial", 7, "SUCCEEDED", 1), EntityRow("attempt", 3, "RUNNING", 7)]
    started = EventRow(9, "attempt", 3, "STARTING", "RUNNING", "started", "system:supervisor")
    violations = checks.check_state_machine([*LEGAL, started], rows).violations
    assert violations == ["attempt 3: still RUNNING",
                          "trial 7: SUCCEEDED with an attempt still live"]


# -- the soak itself ------------------------------------------------------------------------


@pytest.mark.lifecycle
@pytest.mark.soak
@pytest.mark.timeout(1200)
def test_a_five_minute_soak_on_sqlite_keeps_every_invariant(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        reason = "the soak mounts a tmpfs as the runs' disk: it needs root"
        if os.environ.get("MUSTER_REQUIRE_SOAK") == "1":
            pytest.fail(f"{reason} (and MUSTER_REQUIRE_SOAK=1 requires the soak)")
        pytest.skip(reason)
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "soak.py"), "--minutes", "5",
                           "--seed", "1", "--store", "sqlite", "--json", str(out)],
                          capture_output=True, text=True, timeout=1100, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-5000:]}"
    assert out.exists()
