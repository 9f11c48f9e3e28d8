"""A trial's verdict, table by table: the words the API, the CLI and the UI all show."""

from __future__ import annotations

from typing import Any

import pytest

from muster.states import CheckStatus
from muster.verdicts import (
    MAX_DETAIL_CHARS,
    MAX_VERDICT_CHARS,
    Verdict,
    VerdictCounts,
    check_status,
    count_verdicts,
    verdict_of,
)


def check(name: str, status: str, detail: str) -> dict[str, Any]:
    """A check as the supervisor stores it now: with its status."""
    return {"name": name, "passed": status in ("passed", "warning"), "detail": detail,
            "status": status}


def judged(verified: bool, *checks: dict[str, Any]) -> dict[str, Any]:
    passed = all(c["passed"] for c in checks)
    return {"passed": passed, "verified": verified, "checks": list(checks)}


SAMPLES = check("samples", "passed", "2 epochs, each within 1.0% of 100")
CHECKPOINT_MISSING = check("checkpoint", "failed", "no intact checkpoint")
STOPPED_SHORT = check("completed", "failed", "stopped at step 140 of 200 (70%)")
NO_LENGTH = check("completed", "not_run", "not run: no planned length")
NO_METRIC = check("finite_metrics", "not_run", "not run: no metric reported")
RANKS_WARN = check("consistent_ranks", "passed",
                   "warning: OMP_NUM_THREADS: 1 vs 4 (rank 1)") | {"status": "warning"}


@pytest.mark.parametrize(("state", "verification", "extra", "expected"), [
    # Not ended: no verdict yet, its state in words.
    ("QUEUED", None, {}, Verdict(None, "queued")),
    ("RUNNING", None, {}, Verdict(None, "running")),
    ("RESTARTING", None, {}, Verdict(None, "restarting")),
    ("PAUSED", None, {}, Verdict(None, "paused")),
    # SUCCEEDED and verified; stopped early by the searcher says so.
    ("SUCCEEDED", judged(True, SAMPLES), {}, Verdict(True, "verified")),
    ("SUCCEEDED", judged(True, SAMPLES), {"early_stopped": True},
     Verdict(True, "verified (stopped early by the searcher)")),
    # A warning is seen, and said, but does not take the verdict away.
    ("SUCCEEDED", judged(True, SAMPLES, RANKS_WARN), {},
     Verdict(True, "verified; consistent_ranks: warning: OMP_NUM_THREADS: 1 vs 4 (rank 1)")),
    # SUCCEEDED, not verified: why, from the checks that did not run.
    ("SUCCEEDED", judged(False, NO_METRIC, NO_LENGTH), {},
     Verdict(False, "exit 0 — not verified: completed: no planned length; finite_metrics: "
                    "no metric reported")),
    ("SUCCEEDED", judged(False, check("metrics_readable", "passed", "all lines read")), {},
     Verdict(False, "exit 0 — not verified: no check inspected its results")),
    ("SUCCEEDED", judged(False), {"early_stopped": True},
     Verdict(False, "exit 0 — not verified (stopped early by the searcher): no check "
                    "inspected its results")),
    ("SUCCEEDED", None, {}, Verdict(False, "exit 0 — not verified: no verification recorded")),
    # SUSPECT: the failed checks, each with its detail.
    ("SUSPECT", judged(False, STOPPED_SHORT, CHECKPOINT_MISSING, SAMPLES), {},
     Verdict(False, "SUSPECT: completed: stopped at step 140 of 200 (70%); checkpoint: no "
                    "intact checkpoint")),
    # Approved on review: SUCCEEDED, never verified.
    ("SUCCEEDED", judged(False, CHECKPOINT_MISSING),
     {"reason": "review approved", "message": "fine, the model was saved elsewhere"},
     Verdict(False, "approved by review, not verified: checkpoint: no intact checkpoint")),
    ("FAILED", judged(False, CHECKPOINT_MISSING),
     {"reason": "review rejected", "message": "no model"},
     Verdict(False, "failed: rejected by review: checkpoint: no intact checkpoint")),
    ("FAILED", None, {"reason": "USER_ERROR", "message": "exit 1: ValueError: bad lr"},
     Verdict(False, "failed: exit 1: ValueError: bad lr")),
    ("FAILED", None, {"reason": "OOM"}, Verdict(False, "failed: OOM")),
    ("CANCELED", None, {"reason": "killed", "message": "killed before it started"},
     Verdict(False, "canceled")),
])
def test_the_verdict_of_each_ending(state: str, verification: dict[str, Any] | None,
                                    extra: dict[str, Any], expected: Verdict) -> None:
    assert verdict_of(state, verification, **extra) == expected


@pytest.mark.parametrize(("stored", "status"), [
    ({"name": "samples", "passed": True, "detail": "ok"}, CheckStatus.PASSED),
    ({"name": "samples", "passed": False, "detail": "epoch 1: 4 of 5"}, CheckStatus.FAILED),
    ({"name": "consistent_ranks", "passed": True, "detail": "warning: seeds differ"},
     CheckStatus.WARNING),
    ({"name": "completed", "passed": True, "detail": "not run: no planned length",
      "status": "not_run"}, CheckStatus.NOT_RUN),
    # A status muster does not know is read as from before statuses: from `passed`.
    ({"name": "x", "passed": False, "detail": "", "status": "maybe"}, CheckStatus.FAILED),
])
def test_a_check_stored_before_statuses_gets_one(stored: dict[str, Any],
                                                  status: CheckStatus) -> None:
    assert check_status(stored) is status


def test_a_row_from_before_statuses_reads_the_same() -> None:
    """Checks stored without `status`: a warning is a warning, a failure a failure."""
    old = {"passed": False, "verified": False, "checks": [
        {"name": "samples", "passed": False, "detail": "epoch 1: 4 samples seen, 5 expected"},
        {"name": "consistent_ranks", "passed": True, "detail": "warning: seeds differ"}]}
    assert verdict_of("SUSPECT", old).line == (
        "SUSPECT: samples: epoch 1: 4 samples seen, 5 expected")
    assert verdict_of("SUCCEEDED", {**old, "passed": True, "verified": True}).line == (
        "verified; consistent_ranks: warning: seeds differ")


def test_the_line_is_one_line_and_bounded() -> None:
    long_detail = "Traceback line\n" + "x" * 5000
    many = [check(f"check_{n}", "failed", long_detail) for n in range(20)]
    verdict = verdict_of("SUSPECT", judged(False, *many))
    assert "\n" not in verdict.line and len(verdict.line) == MAX_VERDICT_CHARS
    assert verdict.line.endswith("…")
    first = verdict.line.split("; ")[0]
    assert first.startswith("SUSPECT: check_0: Traceback line xxx") and first.endswith("…")
    assert len(first) == len("SUSPECT: check_0: ") + MAX_DETAIL_CHARS
    failed = verdict_of("FAILED", None, message="exit 1\n" + "y" * 1000).line
    assert "\n" not in failed and len(failed) == MAX_VERDICT_CHARS


def test_counts() -> None:
    counts = count_verdicts(["SUCCEEDED", "SUCCEEDED", "SUCCEEDED", "SUSPECT", "FAILED"],
                            [True, False, None])
    assert counts == VerdictCounts(verified=1, not_verified=2, suspect=1)
    assert counts.words() == "1 verified, 2 not verified, 1 SUSPECT"
    assert counts.to_json() == {"verified": 1, "not_verified": 2, "suspect": 1}
    assert VerdictCounts.from_json(counts.to_json()) == counts
    assert VerdictCounts(verified=3).brief() == "3 verified"
    assert VerdictCounts().brief() == ""
