"""Verification's `log_complete` check, table-tested: output a log lost fails it (the exit 0
is SUSPECT and never verified), output its log_limit dropped warns, a whole log passes; and
what `gather_evidence` reads for it from the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from muster.launch.log_limit import LogDrops
from muster.rundir import RunDir
from muster.supervise.verification import (
    Evidence,
    LogLoss,
    VerifyConfig,
    gather_evidence,
    verify,
)

NO_CHECKS = VerifyConfig(require_checkpoint=False, finite_metrics=False)
MiB = 1 << 20


def log_complete(*losses: LogLoss) -> tuple[str, str, bool]:
    verdict = verify(Evidence(log_losses=losses), NO_CHECKS, None)
    [check] = [c for c in verdict.checks if c.name == "log_complete"]
    return check.status, check.detail, verdict.passed


@pytest.mark.parametrize(("losses", "expected"), [
    ((LogLoss(0), LogLoss(1)),
     ("passed", "every byte of output reached the log (2 ranks)", True)),
    ((LogLoss(0, lost_bytes=int(1.2 * MiB), error="No space left on device"), LogLoss(1)),
     ("failed", "rank 0 lost 1.2 MiB of output (No space left on device): the log is "
                "incomplete", False)),
    ((LogLoss(1, lost_bytes=512),),
     ("failed", "rank 1 lost 512 B of output: the log is incomplete", False)),
    ((LogLoss(0, error="the log could not be synced to disk: Input/output error"),),
     ("failed", "rank 0's log is incomplete: the log could not be synced to disk: "
                "Input/output error", False)),
    ((LogLoss(0, dropped_bytes=2 * MiB, limit=MiB),),
     ("warning", "warning: rank 0's log reached resources.log_limit (1 MiB): 2 MiB of output "
                 "from its middle were dropped, as the limit asks (its head and its latest "
                 "output are kept)", True)),
    ((LogLoss(0, dropped_bytes=2 * MiB, limit=MiB), LogLoss(1, lost_bytes=10)),
     ("failed", "rank 1 lost 10 B of output: the log is incomplete", False)),
])
def test_log_complete(losses: tuple[LogLoss, ...], expected: tuple[str, str, bool]) -> None:
    assert log_complete(*losses) == expected


def test_a_failed_log_complete_is_never_verified() -> None:
    verdict = verify(Evidence(log_losses=(LogLoss(0, lost_bytes=1),)), NO_CHECKS, None)
    assert not verdict.passed and not verdict.verified


def test_without_gathered_losses_the_check_does_not_run() -> None:
    assert "log_complete" not in [c.name for c in verify(Evidence(), NO_CHECKS, None).checks]


def test_gather_evidence_reads_why_from_the_exit_record_and_drops_from_the_log_record(
        tmp_path: Path) -> None:
    files = RunDir(tmp_path).attempt(2).rank(0)
    files.attempt_dir.mkdir(parents=True)
    files.exit.write_text(json.dumps({"log_lost_error": "No space left on device"}))
    files.dropped.write_text(json.dumps(LogDrops(MiB, ((10, 20),), 10).to_json()))
    evidence = gather_evidence(tmp_path, [1, 2], log_lost={0: 99, 1: 0})
    assert evidence.log_losses == (LogLoss(0, 99, "No space left on device", 10, MiB),
                                   LogLoss(1))
