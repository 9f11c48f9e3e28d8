"""Whether what muster said about a drill's run caught its fault (pure)."""

from __future__ import annotations

from typing import Any

from muster.drill.faults import Situation, advice, skip_reason
from muster.drill.judge import CleanRun, clean_run, judge, summary
from muster.states import CheckStatus, DrillFault

INJECTED = 1000.0
CLEAN = CleanRun("SUCCEEDED", True, 20.0, {"samples": CheckStatus.PASSED,
                                            "checkpoint": CheckStatus.PASSED})
PLAIN_CLEAN = CleanRun("SUCCEEDED", True, 20.0, {"samples": CheckStatus.NOT_RUN,
                                                  "outputs": CheckStatus.PASSED})


def attempt(number: int, ended_at: float | None, reason: str | None,
            message: str | None = None) -> dict[str, Any]:
    return {"number": number, "state": "ENDED", "standby": False, "reason": reason,
            "message": message, "run_dir": "", "started_at": 0.0, "ended_at": ended_at,
            "replicas": []}


def trial(state: str, verified: bool | None, attempts: list[dict[str, Any]],
          ended_at: float = 1030.0, reason: str | None = None,
          message: str | None = None) -> Any:
    return {"id": 3, "state": state, "verified": verified, "attempts": attempts,
            "reason": reason, "message": message, "verdict": f"{state} verdict",
            "started_at": 990.0, "ended_at": ended_at,
            "verification": {"checks": [{"name": "samples", "status": "failed"}]}}


def test_a_killed_rank_that_muster_restarted_is_caught_at_the_attempt_s_end() -> None:
    ran = trial("SUCCEEDED", True, [attempt(1, 1002.5, "USER_ERROR", "killed by SIGKILL"),
                                   attempt(2, 1030.0, "OK")])
    row = judge(DrillFault.KILL_RANK, ran, INJECTED, CLEAN)
    assert row["caught"] is True
    assert row["detect_seconds"] == 2.5
    assert row["class"] == "USER_ERROR"
    assert row["message"] == "killed by SIGKILL"
    assert row["advice"] is None


def test_a_suspect_run_is_caught_when_its_verdict_was_given() -> None:
    ran = trial("SUSPECT", False, [attempt(1, 1020.0, "OK")], ended_at=1021.0,
                message="samples: 10% fewer")
    row = judge(DrillFault.CORRUPT_DATA, ran, INJECTED, CLEAN)
    assert (row["caught"], row["detect_seconds"], row["state"]) == (True, 21.0, "SUSPECT")


def test_a_verified_run_after_a_data_fault_is_not_caught_and_the_advice_counts_samples(
) -> None:
    ran = trial("SUCCEEDED", True, [attempt(1, 1020.0, "OK")])
    row = judge(DrillFault.CORRUPT_DATA, ran, INJECTED, PLAIN_CLEAN)
    assert row["caught"] is False
    assert row["detect_seconds"] is None
    assert "data: {path: DIR}" in row["advice"] and "samples_from_log" in row["advice"]


def test_with_samples_counted_the_data_advice_is_about_the_loader() -> None:
    assert "decode" in advice(DrillFault.DROP_DATA, CLEAN.checks)


def test_a_server_restart_is_survived_when_the_verdict_is_the_clean_run_s() -> None:
    same = judge(DrillFault.SERVER_RESTART, trial("SUCCEEDED", True, []), INJECTED, CLEAN)
    assert (same["caught"], same["expected"], same["advice"]) == (True, "survive", None)
    other = judge(DrillFault.SERVER_RESTART, trial("FAILED", False, []), INJECTED, CLEAN)
    assert other["caught"] is False and "muster's bug" in other["advice"]


def test_a_run_the_drill_gave_up_on_is_not_caught_and_the_hang_advice_names_the_wait(
) -> None:
    ran = trial("CANCELED", False, [attempt(1, 1200.0, "STOPPED")])
    row = judge(DrillFault.HANG, ran, INJECTED, CLEAN, timed_out=180.0, timeout=1800.0)
    assert row["caught"] is False
    assert row["message"].startswith("not caught within 180 s")
    assert "30m 00s" in row["advice"]


def test_an_attempt_that_failed_before_the_fault_does_not_count() -> None:
    ran = trial("SUCCEEDED", True, [attempt(1, 900.0, "INFRA"), attempt(2, 1030.0, "OK")])
    assert judge(DrillFault.OOM, ran, INJECTED, CLEAN)["caught"] is False


def test_the_clean_run_keeps_its_checks() -> None:
    clean = clean_run(trial("SUCCEEDED", True, []))
    assert clean.seconds == 40.0
    assert clean.checks == {"samples": CheckStatus.FAILED}
    assert CleanRun.from_json(clean.to_json()) == clean


def test_the_summary_counts_caught_faults_and_names_the_missed_and_the_skipped() -> None:
    rows = [{"name": "kill-rank", "caught": True, "expected": "named"},
            {"name": "corrupt-data", "caught": False, "expected": "named",
             "advice": "count samples"},
            {"name": "nan", "caught": None, "expected": "named"}]
    text = summary(rows, [("disk-full", "not root")])
    assert text == ("1 of 2 faults caught; `corrupt-data` passed unnoticed: count samples; "
                    "skipped: `disk-full` (not root)")


def test_what_a_server_or_a_config_cannot_have_is_skipped_with_the_reason() -> None:
    plain = Situation(data_path=None, reports_metrics=False, replicas=1, root=False,
                      admin=False, ray=False)
    reasons = {f: skip_reason(f, plain) for f in DrillFault}
    assert "data: {path: DIR}" in str(reasons[DrillFault.CORRUPT_DATA])
    assert "harness" in str(reasons[DrillFault.NAN])
    assert "root" in str(reasons[DrillFault.DISK_FULL])
    assert "admin" in str(reasons[DrillFault.SERVER_RESTART])
    assert "Ray" in str(reasons[DrillFault.NETWORK])
    assert reasons[DrillFault.KILL_RANK] is None and reasons[DrillFault.HANG] is None


def test_hidden_files_a_run_had_read_are_harmless_when_its_samples_were_counted() -> None:
    ran = trial("SUCCEEDED", True, [attempt(1, 1020.0, "OK")])
    ran["verification"] = {"checks": [{"name": "samples", "status": "passed"}]}
    row = judge(DrillFault.DROP_DATA, ran, INJECTED, CLEAN)
    assert row["caught"] is True and row["message"].startswith("harmless here")
    assert judge(DrillFault.CORRUPT_DATA, ran, INJECTED, CLEAN)["caught"] is False


def test_beside_an_unverified_clean_run_only_a_different_end_is_caught() -> None:
    unverified = CleanRun("SUCCEEDED", False, 20.0, {"completed": CheckStatus.NOT_RUN})
    same = trial("SUCCEEDED", False, [attempt(1, 1020.0, "OK")])
    assert judge(DrillFault.NAN, same, INJECTED, unverified)["caught"] is False
    failed = trial("FAILED", False, [attempt(1, 1020.0, "USER_ERROR", "Traceback …")])
    row = judge(DrillFault.DISK_FULL, failed, INJECTED, unverified)
    assert (row["caught"], row["class"], row["detect_seconds"]) == (True, "USER_ERROR", 20.0)


def test_faults_missed_for_one_reason_share_its_advice_in_the_summary() -> None:
    rows = [{"name": n, "caught": False, "expected": "named", "advice": "count samples"}
            for n in ("corrupt-data", "drop-data")]
    assert summary(rows, []) == ("0 of 2 faults caught; `corrupt-data` and `drop-data` "
                                 "passed unnoticed: count samples")


def test_a_warm_standby_let_go_or_a_requested_stop_does_not_name_a_fault() -> None:
    standby = {**attempt(2, 1010.0, "standby", "the warm standby was not needed"),
               "standby": True}
    ran = trial("SUCCEEDED", True, [attempt(1, 1010.0, "OK"), standby,
                                    attempt(3, 1020.0, "STOPPED")])
    assert judge(DrillFault.KILL_RANK, ran, INJECTED, CLEAN)["caught"] is False


def test_a_cut_link_is_caught_when_named_or_survived_and_missed_when_the_end_differs() -> None:
    named = trial("SUCCEEDED", True, [attempt(1, 1031.0, "INFRA", "rank 1: its node is gone"),
                                     attempt(2, 1080.0, "OK")])
    row = judge(DrillFault.NETWORK, named, INJECTED, CLEAN)
    assert (row["caught"], row["detect_seconds"], row["class"]) == (True, 31.0, "INFRA")
    survived = judge(DrillFault.NETWORK, trial("SUCCEEDED", True, [attempt(1, 1060.0, "OK")]),
                     INJECTED, CLEAN)
    assert survived["caught"] is True and survived["message"].startswith("survived")
    assert survived["detect_seconds"] is None
    hung = judge(DrillFault.NETWORK, trial("CANCELED", False, [attempt(1, 1400.0, "STOPPED")]),
                 INJECTED, CLEAN, timed_out=300.0, timeout=120.0)
    assert hung["caught"] is False and "init_process_group(timeout" in hung["advice"]


def test_the_network_fault_needs_ray_and_the_admin_s_link_commands() -> None:
    on_ray = Situation(data_path=None, reports_metrics=True, replicas=2, root=True,
                       admin=False, ray=True)
    assert "ray.drill_network" in str(skip_reason(DrillFault.NETWORK, on_ray))
    ready = Situation(data_path=None, reports_metrics=True, replicas=2, root=True,
                      admin=False, ray=True, link_commands=True)
    assert skip_reason(DrillFault.NETWORK, ready) is None
