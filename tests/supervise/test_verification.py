"""Verification: `verify` table by table, `gather_evidence` on run directories written by hand.

The files follow docs/run-directory.md; they are written here directly, not by the harness,
so each test controls every byte (a torn line, a flipped byte in a checkpoint).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import pytest

from muster.supervise.log_errors import Finding, RankScan
from muster.supervise.log_metrics import LogMetricEvidence
from muster.supervise.log_samples import LogSamples
from muster.supervise.verification import (
    EMPTY_DATA,
    NOT_VERIFIED,
    Check,
    CheckpointInfo,
    Evidence,
    LogCounts,
    MetricPoint,
    OutputFile,
    Planned,
    Progress,
    SaveFailure,
    SourceEpochs,
    Verdict,
    VerifyConfig,
    WarmStartFrom,
    combine_log_counts,
    gather_evidence,
    verify,
)

MINUS = "\u2212"
CKPT = "step-000000000042-ab12cd34"
INTACT = CheckpointInfo(f"/run/checkpoints/{CKPT}", 42, True, None)
CHANGED = CheckpointInfo(f"/run/checkpoints/{CKPT}", 42, False,
                         "model.pt does not match its sha256 in metadata.json")
LATER = CheckpointInfo("/run/checkpoints/step-000000000100-00ff00ff", 100, True, None)
NO_CHECKS = VerifyConfig(require_checkpoint=False, finite_metrics=False)


def nan_at(step: int, name: str = "loss", kind: str = "training") -> MetricPoint:
    return MetricPoint(kind, step, name, math.nan, attempt=1, rank=0)


def check_of(verdict: Verdict, name: str) -> Check:
    (found,) = [c for c in verdict.checks if c.name == name]
    return found


# --- verify: samples ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "config", "manifest", "passed", "detail"),
    [
        ({e: 1797 for e in range(15)}, NO_CHECKS, 1797, True,
         "15 epochs, each within 1.0% of 1,797"),
        ({0: 1797}, NO_CHECKS, 1797, True, "1 epoch, each within 1.0% of 1,797"),
        # 1% of 1,797 is 17.97: 17 off passes, 18 off fails
        ({0: 1780, 1: 1814}, NO_CHECKS, 1797, True, "2 epochs, each within 1.0% of 1,797"),
        ({0: 1779}, NO_CHECKS, 1797, False,
         f"epoch 0: 1,779 samples seen, 1,797 expected ({MINUS}1.0%)"),
        ({0: 1797, 3: 1581}, NO_CHECKS, 1797, False,
         f"epoch 3: 1,581 samples seen, 1,797 expected ({MINUS}12.0%)"),
        ({0: 1797, 1: 2000, 2: 900}, NO_CHECKS, 1797, False,
         "epoch 1: 2,000 samples seen, 1,797 expected (+11.3%); "
         f"epoch 2: 900 samples seen, 1,797 expected ({MINUS}49.9%)"),
        # expected_samples wins over the manifest
        ({0: 1500}, VerifyConfig(expected_samples=1500, require_checkpoint=False), 1797, True,
         "1 epoch, each within 1.0% of 1,500"),
        ({0: 1500}, VerifyConfig(samples_tolerance=0.2, require_checkpoint=False), 1797, True,
         "1 epoch, each within 20.0% of 1,797"),
        ({0: 1_000_000}, VerifyConfig(samples_tolerance=0.0025, require_checkpoint=False),
         1_000_000, True, "1 epoch, each within 0.25% of 1,000,000"),
        # a tight tolerance shows the small percentage, not "+0.0%"
        ({0: 1_000_010}, VerifyConfig(samples_tolerance=0.0, require_checkpoint=False),
         1_000_000, False, "epoch 0: 1,000,010 samples seen, 1,000,000 expected (+0.001%)"),
        ({}, NO_CHECKS, 1797, False,
         "no samples were reported (ctx.samples.seen); expected 1,797 per epoch"),
        # an empty data set verifies nothing, whatever the script counted
        ({0: 5}, NO_CHECKS, 0, False, EMPTY_DATA),
        ({0: 0}, NO_CHECKS, 0, False, EMPTY_DATA),
    ],
)
def test_samples_check(
    samples: dict[int, int], config: VerifyConfig, manifest: int, passed: bool, detail: str
) -> None:
    verdict = verify(Evidence(samples_by_epoch=samples), config, manifest)
    check = check_of(verdict, "samples")
    assert (check.passed, check.detail) == (passed, detail)
    assert verdict.passed is passed


@pytest.mark.parametrize("samples", [{}, {0: 3}])
def test_samples_check_is_omitted_without_an_expected_count(samples: dict[int, int]) -> None:
    verdict = verify(Evidence(samples_by_epoch=samples), NO_CHECKS, None)
    assert [c.name for c in verdict.checks] == ["completed", "metrics_readable"]
    assert verdict.passed


def test_unreadable_samples_file_fails_the_samples_check() -> None:
    evidence = Evidence(samples_by_epoch={0: 1797},
                        unreadable_samples_files=("attempt-1/rank-1.samples.json",))
    check = check_of(verify(evidence, NO_CHECKS, 1797), "samples")
    assert not check.passed
    assert check.detail == "unreadable sample counts in attempt-1/rank-1.samples.json"


# --- verify: checkpoint -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoints", "harness_used", "require", "expected"),
    [
        ((INTACT,), True, None, (True, f"1 intact, latest {CKPT}")),
        ((INTACT, LATER), False, True,
         (True, "2 intact, latest step-000000000100-00ff00ff")),
        ((CHANGED, LATER), True, None,
         (True, f"1 intact, latest step-000000000100-00ff00ff; {CKPT}: model.pt does not "
                "match its sha256 in metadata.json")),
        ((CHANGED,), True, None,
         (False, f"no intact checkpoint: {CKPT}: model.pt does not match its sha256 in "
                 "metadata.json")),
        ((), True, None, (False, "no checkpoint was saved (checkpoints/ is empty)")),
        ((), False, True, (False, "no checkpoint was saved (checkpoints/ is empty)")),
        # not required: no harness and no setting, or switched off
        ((), False, None, None),
        ((CHANGED,), True, False, None),
    ],
)
def test_checkpoint_check(
    checkpoints: tuple[CheckpointInfo, ...], harness_used: bool, require: bool | None,
    expected: tuple[bool, str] | None,
) -> None:
    evidence = Evidence(checkpoints=checkpoints, harness_used=harness_used)
    verdict = verify(evidence, VerifyConfig(require_checkpoint=require), None)
    found = [(c.passed, c.detail) for c in verdict.checks if c.name == "checkpoint"]
    assert found == ([] if expected is None else [expected])


# --- verify: check-ins (harness: true) ------------------------------------------------------


@pytest.mark.parametrize(
    ("checked_in", "world_size", "expected"),
    [
        ({0}, 1, (True, "the 1 rank checked in through muster.harness.init()")),
        ({0, 1, 2}, 3, (True, "all 3 ranks checked in through muster.harness.init()")),
        ({0, 2}, 3, (False, "rank 1 of attempt 2 never checked in through "
                            "muster.harness.init(), although the config sets `harness: true`")),
        (set(), 2, (False, "ranks 0 and 1 of attempt 2 never checked in through "
                           "muster.harness.init(), although the config sets `harness: true`")),
    ],
)
def test_check_in_check(checked_in: set[int], world_size: int,
                        expected: tuple[bool, str]) -> None:
    evidence = Evidence(final_attempt=2, checked_in=frozenset(checked_in), checkpoints=(INTACT,))
    verdict = verify(evidence, VerifyConfig(), None, harness_ranks=world_size)
    assert [(c.passed, c.detail) for c in verdict.checks if c.name == "check_in"] == [expected]
    assert verdict.passed is expected[0]


def test_declaring_the_harness_requires_a_checkpoint_by_default() -> None:
    evidence = Evidence(final_attempt=1, checked_in=frozenset({0}))
    assert not evidence.harness_used
    verdict = verify(evidence, VerifyConfig(), None, harness_ranks=1)
    assert [(c.name, c.passed) for c in verdict.checks][1:3] == [
        ("check_in", True), ("checkpoint", False)]
    assert "check_in" not in [c.name for c in verify(evidence, VerifyConfig(), None).checks]


def test_check_ins_are_read_from_the_final_attempt_only(tmp_path: Path) -> None:
    for attempt, ranks in ((1, (0, 1)), (2, (1,))):
        (tmp_path / f"attempt-{attempt}").mkdir()
        for rank in ranks:
            (tmp_path / f"attempt-{attempt}" / f"rank-{rank}.heartbeat.json").write_text("{}")
    evidence = gather_evidence(tmp_path, [2, 1])
    assert (evidence.final_attempt, evidence.checked_in) == (2, frozenset({1}))


# --- verify: metrics ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("evidence", "passed", "detail"),
    [
        (Evidence(), True, "not run: no metric reported"),
        (Evidence(metric_names=frozenset({"loss", "val_loss"})), True,
         "no NaN or infinite value (2 metrics)"),
        (Evidence(metric_names=frozenset({"loss"})), True,
         "no NaN or infinite value (1 metric)"),
        (Evidence(non_finite=(nan_at(120),), non_finite_count=1), False,
         "loss was NaN at step 120 (training)"),
        (Evidence(non_finite=(MetricPoint("validation", 7, "val_loss", -math.inf, 2, 1),),
                  non_finite_count=1), False,
         "val_loss was -Infinity at step 7 (validation, attempt 2, rank 1)"),
        (Evidence(non_finite=(MetricPoint("training", 3, "grad", math.inf, 1, 0),),
                  non_finite_count=1), False, "grad was Infinity at step 3 (training)"),
        # at most 5 named, earliest first, then a count of the rest
        (Evidence(non_finite=tuple(nan_at(s) for s in (60, 10, 50, 20, 40, 30, 70)),
                  non_finite_count=1234), False,
         "; ".join(f"loss was NaN at step {s} (training)" for s in (10, 20, 30, 40, 50))
         + "; and 1,229 more non-finite values"),
        (Evidence(non_finite=tuple(nan_at(s) for s in range(5)), non_finite_count=6), False,
         "; ".join(f"loss was NaN at step {s} (training)" for s in range(5))
         + "; and 1 more non-finite value"),
    ],
)
def test_finite_metrics_check(evidence: Evidence, passed: bool, detail: str) -> None:
    check = check_of(verify(evidence, VerifyConfig(require_checkpoint=False), None),
                     "finite_metrics")
    assert (check.passed, check.detail) == (passed, detail)


def test_finite_metrics_check_can_be_switched_off() -> None:
    evidence = Evidence(non_finite=(nan_at(1),), non_finite_count=1)
    verdict = verify(evidence, NO_CHECKS, None)
    assert verdict.passed
    assert "finite_metrics" not in [c.name for c in verdict.checks]


@pytest.mark.parametrize(
    ("reported", "required", "passed", "detail"),
    [
        ({"loss", "val_loss"}, ("val_loss",), True, "reported: val_loss"),
        ({"loss", "val_loss", "acc"}, ("val_loss", "acc"), True, "reported: val_loss, acc"),
        ({"loss"}, ("val_loss",), False, "val_loss was never reported"),
        (set(), ("val_loss", "acc"), False,
         "val_loss was never reported; acc was never reported"),
    ],
)
def test_require_metrics_check(
    reported: set[str], required: tuple[str, ...], passed: bool, detail: str
) -> None:
    config = VerifyConfig(require_checkpoint=False, require_metrics=list(required))
    check = check_of(verify(Evidence(metric_names=frozenset(reported)), config, None),
                     "require_metrics")
    assert (check.passed, check.detail) == (passed, detail)


@pytest.mark.parametrize(
    ("evidence", "passed", "detail"),
    [
        (Evidence(metric_lines=12_345), True, "12,345 metric lines read"),
        (Evidence(metric_lines=1), True, "1 metric line read"),
        (Evidence(metric_lines=10, unreadable_metric_lines=1,
                  first_unreadable_metric_line="attempt-1/rank-0.metrics.jsonl:4"), False,
         "1 unreadable metric line (the first at attempt-1/rank-0.metrics.jsonl:4)"),
        (Evidence(unreadable_metric_lines=2000,
                  first_unreadable_metric_line="attempt-2/rank-1.metrics.jsonl:1"), False,
         "2,000 unreadable metric lines (the first at attempt-2/rank-1.metrics.jsonl:1)"),
    ],
)
def test_metrics_readable_check(evidence: Evidence, passed: bool, detail: str) -> None:
    check = check_of(verify(evidence, NO_CHECKS, None), "metrics_readable")
    assert (check.passed, check.detail) == (passed, detail)


# --- verify: the verdict ------------------------------------------------------------------


def test_verdict_passes_only_when_every_check_passes() -> None:
    good = Evidence(samples_by_epoch={0: 1797, 1: 1797}, metric_names=frozenset({"loss"}),
                    metric_lines=40, checkpoints=(INTACT,), harness_used=True)
    config = VerifyConfig(require_metrics=["loss"])
    verdict = verify(good, config, 1797)
    assert verdict.passed
    assert [c.name for c in verdict.checks] == [
        "completed", "samples", "checkpoint", "checkpoint_fresh", "finite_metrics",
        "require_metrics", "metrics_readable"]
    assert all(c.detail for c in verdict.checks)

    one_bad = Evidence(samples_by_epoch=good.samples_by_epoch, metric_names=frozenset(),
                       metric_lines=40, checkpoints=(INTACT,), harness_used=True)
    failed = verify(one_bad, config, 1797)
    assert not failed.passed
    assert [c.name for c in failed.checks if not c.passed] == ["require_metrics"]


def test_verdict_to_json() -> None:
    verdict = verify(Evidence(samples_by_epoch={0: 10}), NO_CHECKS, 20)
    assert verdict.to_json() == {
        "passed": False,
        "verified": False,
        "why_not_verified": None,  # it is not passed, let alone verified: SUSPECT
        "checks": [
            {"name": "completed", "passed": True, "status": "not_run",
             "detail": "not run: no planned length (set verify.expected_length or "
                       "searcher.max_length, or call ctx.plan() in the script)"},
            {"name": "samples", "passed": False, "status": "failed",
             "detail": f"epoch 0: 10 samples seen, 20 expected ({MINUS}50.0%)"},
            {"name": "metrics_readable", "passed": True, "status": "not_run",
             "detail": "not run: no metric line was written"},
        ],
        "epochs": {"whole": 1, "last": 0},  # what a run that starts from it goes on from
    }
    json.dumps(verdict.to_json())


# --- gather_evidence on real files --------------------------------------------------------


def write_samples(run_dir: Path, attempt: int, rank: int, epochs: dict[int, int]) -> None:
    path = run_dir / f"attempt-{attempt}" / f"rank-{rank}.samples.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "epochs": {str(e): n for e, n in epochs.items()}}))


def metric_line(step: int, metrics: dict[str, float], kind: str = "training",
                rank: int = 0) -> str:
    return json.dumps({"kind": kind, "step": step, "metrics": metrics, "time": 1.5e9,
                       "rank": rank}) + "\n"


def write_metrics(run_dir: Path, attempt: int, rank: int, text: str) -> None:
    path = run_dir / f"attempt-{attempt}" / f"rank-{rank}.metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_checkpoint(run_dir: Path, step: int, files: dict[str, bytes]) -> Path:
    """A complete checkpoint as the harness leaves it: the files, then metadata.json."""
    path = run_dir / "checkpoints" / f"step-{step:012d}-ab12cd34"
    path.mkdir(parents=True)
    for relative, data in files.items():
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        (path / relative).write_bytes(data)
    digests = {r: hashlib.sha256(d).hexdigest() for r, d in files.items()}
    metadata = {"step": step, "time": 1.5e9, "trial_id": "t", "attempt": 1, "rank": 0,
                "hparams": {}, "metadata": {}, "files": digests}
    (path / "metadata.json").write_text(json.dumps(metadata))
    return path


def test_samples_sum_ranks_and_take_each_epoch_from_its_last_attempt(tmp_path: Path) -> None:
    # attempt 1 finished epochs 0-1 and was interrupted in epoch 2; attempt 2 redid epoch 2
    write_samples(tmp_path, 1, 0, {0: 900, 1: 900, 2: 300})
    write_samples(tmp_path, 1, 1, {0: 897, 1: 897, 2: 310})
    write_samples(tmp_path, 2, 0, {2: 900, 3: 900})
    write_samples(tmp_path, 2, 1, {2: 897, 3: 897})
    evidence = gather_evidence(tmp_path, [1, 2])
    assert evidence.samples_by_epoch == {0: 1797, 1: 1797, 2: 1797, 3: 1797}
    assert verify(evidence, NO_CHECKS, 1797).passed
    # without attempt 2 the interrupted epoch shows as a shortfall
    alone = gather_evidence(tmp_path, [1])
    assert alone.samples_by_epoch[2] == 610
    assert "epoch 2: 610 samples seen" in check_of(verify(alone, NO_CHECKS, 1797),
                                                   "samples").detail


def test_attempts_are_read_in_number_order(tmp_path: Path) -> None:
    write_samples(tmp_path, 1, 0, {0: 5})
    write_samples(tmp_path, 2, 0, {0: 7})
    assert gather_evidence(tmp_path, [2, 1]).samples_by_epoch == {0: 7}


def test_unreadable_samples_file_is_named(tmp_path: Path) -> None:
    write_samples(tmp_path, 1, 0, {0: 5})
    (tmp_path / "attempt-1" / "rank-1.samples.json").write_text('{"rank": 1, "epochs": [1]}')
    evidence = gather_evidence(tmp_path, [1])
    assert evidence.samples_by_epoch == {0: 5}
    assert evidence.unreadable_samples_files == ("attempt-1/rank-1.samples.json",)


def test_metrics_torn_last_line_is_skipped_and_a_bad_middle_line_counted(
    tmp_path: Path,
) -> None:
    good = metric_line(1, {"loss": 0.5}) + metric_line(2, {"loss": 0.4})
    write_metrics(tmp_path, 1, 0, good + '{"kind": "training", "st')
    write_metrics(tmp_path, 1, 1, metric_line(1, {"loss": 0.5}, rank=1) + "not json\n"
                  + metric_line(3, {"val_loss": 0.3}, kind="validation", rank=1))
    evidence = gather_evidence(tmp_path, [1])
    assert evidence.metric_lines == 4
    assert evidence.metric_names == {"loss", "val_loss"}
    assert evidence.unreadable_metric_lines == 1
    assert evidence.first_unreadable_metric_line == "attempt-1/rank-1.metrics.jsonl:2"
    assert not check_of(verify(evidence, NO_CHECKS, None), "metrics_readable").passed


def test_metrics_lines_of_the_wrong_shape_are_unreadable(tmp_path: Path) -> None:
    bad = [
        "[1, 2]\n",
        '{"kind": "training", "step": "7", "metrics": {"loss": 1}}\n',
        '{"kind": "training", "step": 7, "metrics": {"loss": "low"}}\n',
        '{"kind": "training", "step": 7, "metrics": {"loss": true}}\n',
        '{"step": 7, "metrics": {"loss": 1}}\n',
    ]
    write_metrics(tmp_path, 1, 0, "".join(bad) + "\n" + metric_line(8, {"loss": 1.0}))
    evidence = gather_evidence(tmp_path, [1])
    assert (evidence.unreadable_metric_lines, evidence.metric_lines) == (len(bad), 1)


def test_non_finite_metrics_are_found_with_name_step_attempt_and_rank(tmp_path: Path) -> None:
    # what Python's json module writes for NaN and infinities: bare NaN / Infinity tokens
    write_metrics(tmp_path, 1, 0, metric_line(1, {"loss": 1.0})
                  + metric_line(120, {"loss": math.nan, "acc": 0.5}))
    write_metrics(tmp_path, 2, 1, "".join(metric_line(s, {"loss": math.inf}, rank=1)
                                          for s in range(200, 210)))
    evidence = gather_evidence(tmp_path, [1, 2])
    assert evidence.non_finite_count == 11
    detail = check_of(verify(evidence, VerifyConfig(), None), "finite_metrics").detail
    assert detail.startswith("loss was NaN at step 120 (training); "
                             "loss was Infinity at step 200 (training, attempt 2, rank 1)")
    assert detail.endswith("; and 6 more non-finite values")


def test_checkpoints_intact_changed_missing_and_without_metadata(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10, {"model.pt": b"weights-10", "opt/state.pt": b"opt"})
    changed = write_checkpoint(tmp_path, 20, {"model.pt": b"weights-20"})
    data = bytearray((changed / "model.pt").read_bytes())
    data[3] ^= 0x01  # one flipped bit, same size
    (changed / "model.pt").write_bytes(bytes(data))
    missing = write_checkpoint(tmp_path, 30, {"model.pt": b"w", "extra.bin": b"x"})
    (missing / "extra.bin").unlink()
    (tmp_path / "checkpoints" / "step-000000000040-00000000").mkdir()
    (tmp_path / "checkpoints" / ".tmp-step-50").mkdir()  # being written: never read
    evidence = gather_evidence(tmp_path, [1])
    assert [(c.step, c.intact, c.problem) for c in evidence.checkpoints] == [
        (10, True, None),
        (20, False, "model.pt does not match its sha256 in metadata.json"),
        (30, False, "extra.bin is missing"),
        (40, False, "metadata.json is missing"),
    ]
    check = check_of(verify(evidence, VerifyConfig(require_checkpoint=True), None),
                     "checkpoint")
    assert check.passed
    assert check.detail == (
        "1 intact, latest step-000000000010-ab12cd34; "
        "step-000000000020-ab12cd34: model.pt does not match its sha256 in metadata.json; "
        "step-000000000030-ab12cd34: extra.bin is missing; "
        "step-000000000040-00000000: metadata.json is missing")


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ("{not json", "metadata.json is not valid JSON (Expecting property name enclosed in "
                      "double quotes: line 1 column 2 (char 1))"),
        ("[]", "metadata.json is not a JSON object"),
        (json.dumps({"step": 5}), 'metadata.json has no "files" object of sha256 sums'),
        (json.dumps({"step": 5, "files": ["model.pt"]}),
         'metadata.json has no "files" object of sha256 sums'),
        (json.dumps({"step": 5, "files": {"../../secret": "00"}}),
         "metadata.json lists '../../secret', which is outside the checkpoint directory"),
    ],
)
def test_checkpoint_with_bad_metadata(tmp_path: Path, metadata: str, problem: str) -> None:
    path = tmp_path / "checkpoints" / "step-000000000005-deadbeef"
    path.mkdir(parents=True)
    (path / "metadata.json").write_text(metadata)
    (checkpoint,) = gather_evidence(tmp_path, [1]).checkpoints
    assert (checkpoint.step, checkpoint.intact, checkpoint.problem) == (5, False, problem)


def test_checkpoint_without_files_is_intact(tmp_path: Path) -> None:
    # what the harness saves when the user writes nothing into the directory
    write_checkpoint(tmp_path, 7, {})
    (checkpoint,) = gather_evidence(tmp_path, [1]).checkpoints
    assert (checkpoint.step, checkpoint.intact, checkpoint.problem) == (7, True, None)


def test_only_corrupt_checkpoints_fail_verification(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, 42, {"model.pt": b"abc"})
    (path / "model.pt").write_bytes(b"abd")
    (tmp_path / "attempt-1").mkdir()
    (tmp_path / "attempt-1" / "rank-0.heartbeat.json").write_text("{}")
    evidence = gather_evidence(tmp_path, [1])
    assert evidence.harness_used
    verdict = verify(evidence, VerifyConfig(), None)
    assert not verdict.passed
    assert check_of(verdict, "checkpoint").detail == (
        "no intact checkpoint: step-000000000042-ab12cd34: model.pt does not match its "
        "sha256 in metadata.json")


def test_harness_used_only_when_a_heartbeat_exists_in_the_given_attempts(
    tmp_path: Path,
) -> None:
    (tmp_path / "attempt-1").mkdir()
    (tmp_path / "attempt-1" / "rank-0.log").write_text("hello\n")
    assert not gather_evidence(tmp_path, [1]).harness_used
    (tmp_path / "attempt-2").mkdir()
    (tmp_path / "attempt-2" / "rank-1.heartbeat.json").write_text("{}")
    assert not gather_evidence(tmp_path, [1]).harness_used
    assert gather_evidence(tmp_path, [1, 2]).harness_used


def test_an_empty_run_directory_gives_empty_evidence(tmp_path: Path) -> None:
    evidence = gather_evidence(tmp_path, [1, 2])
    assert evidence == Evidence(final_attempt=2)
    assert verify(evidence, VerifyConfig(), None).passed  # a script without the harness


# --- verified: an exit 0 whose results were inspected --------------------------------------


EPOCHS_1 = Planned("epochs", 1, "ctx.plan()")
STEP_42 = Progress(highest={"training": 42}, lowest={"training": 1}, final_attempt_step=42)
STEPS_42 = Planned("steps", 42, "verify.expected_length")


@pytest.mark.parametrize(("evidence", "config", "manifest", "passed", "verified"), [
    # Nothing inspected the results: it passes (not a failure) but is not verified.
    (Evidence(), NO_CHECKS, None, True, False),
    (Evidence(metric_names=frozenset({"loss"}), metric_lines=3), VerifyConfig(
        require_checkpoint=False), None, True, False),
    # Results checked, and the run reached its planned end: verified.
    (Evidence(samples_by_epoch={0: 10}, plan=EPOCHS_1), NO_CHECKS, 10, True, True),
    (Evidence(samples_by_epoch={0: 9}, plan=EPOCHS_1), NO_CHECKS, 10, False, False),
    (Evidence(checkpoints=(INTACT,), progress=STEP_42, plan=STEPS_42),
     VerifyConfig(require_checkpoint=True), None, True, True),
    (Evidence(metric_names=frozenset({"loss"}), progress=STEP_42, plan=STEPS_42), VerifyConfig(
        require_checkpoint=False, require_metrics=["loss"]), None, True, True),
    # Results checked, but nothing says how far the run was meant to go: not verified.
    (Evidence(samples_by_epoch={0: 10}), NO_CHECKS, 10, True, False),
    (Evidence(checkpoints=(INTACT,), progress=STEP_42), VerifyConfig(require_checkpoint=True),
     None, True, False),
    # It reached its planned end, but no check looked at what it produced: not verified.
    (Evidence(progress=STEP_42, plan=STEPS_42), NO_CHECKS, None, True, False),
])
def test_verified_needs_its_planned_end_and_a_check_of_the_results(
    evidence: Evidence, config: VerifyConfig, manifest: int | None, passed: bool,
    verified: bool,
) -> None:
    verdict = verify(evidence, config, manifest)
    assert (verdict.passed, verdict.verified) == (passed, verified)
    assert verdict.to_json()["verified"] is verified
    assert bool(verdict.why_not_verified()) is (passed and not verified)


def test_the_words_for_an_unverified_exit_0() -> None:
    assert NOT_VERIFIED == "exit 0 — not verified"
    verdict = verify(Evidence(samples_by_epoch={0: 10}), NO_CHECKS, 10)
    assert verdict.why_not_verified() == (
        "completed: no planned length (set verify.expected_length or "
        "searcher.max_length, or call ctx.plan() in the script)")
    assert verdict.to_json()["why_not_verified"] == verdict.why_not_verified()


LOG_CONFIG = VerifyConfig(require_checkpoint=False, finite_metrics=False,
                          samples_from_log=r"samples=(?P<samples>\d+)")


@pytest.mark.parametrize(("counts", "passed", "detail"), [
    (LogCounts({0: 1797, 1: 1797}, 2), True, "2 epochs in the logs, each within 1.0% of 1,797"),
    (LogCounts({0: 1797, 1: 1581}, 2), False,
     f"epoch 1: 1,581 samples seen, 1,797 expected ({MINUS}12.0%)"),
    (LogCounts(), False, "no log line matched verify.samples_from_log; expected 1,797 per epoch"),
    (LogCounts(unusable=3), False, "no log line matched verify.samples_from_log (3 matches "
                                   "without whole numbers in its groups); expected 1,797 per "
                                   "epoch"),
    (LogCounts({0: 1797}, 1, problems=("attempt 1, rank 0: counting took longer than 60 s",)),
     False, "attempt 1, rank 0: counting took longer than 60 s"),
])
def test_samples_from_log_check(counts: LogCounts, passed: bool, detail: str) -> None:
    verdict = verify(Evidence(log_counts=counts), LOG_CONFIG, 1797,
                     searcher_length=Planned("epochs", 1, "searcher.max_length"))
    assert check_of(verdict, "samples_from_log") == Check("samples_from_log", passed, detail)
    assert verdict.verified is passed


def test_samples_from_log_needs_an_expected_count_to_apply() -> None:
    assert [c.name for c in verify(Evidence(), LOG_CONFIG, None).checks] == [
        "completed", "metrics_readable"]


def test_log_counts_sum_ranks_and_take_each_epoch_from_its_last_attempt() -> None:
    counts = combine_log_counts({
        2: {0: LogSamples({1: 500}, 1), 1: LogSamples({1: 400}, 1, unusable=1)},
        1: {0: LogSamples({0: 450, 1: 100}, 2), 1: LogSamples({0: 450}, 1, "it timed out")},
    })
    assert counts == LogCounts({0: 900, 1: 900}, matches=5, unusable=1,
                               problems=("attempt 1, rank 1: it timed out",))


@pytest.mark.parametrize(("outputs", "passed", "detail"), [
    ((OutputFile("model.pt", 10, 200.0), OutputFile("eval/report.json", 3, 150.0)), True,
     "2 files written: model.pt, eval/report.json"),
    ((OutputFile("model.pt", None, None),), False, "model.pt is missing"),
    ((OutputFile("model.pt", 0, 200.0),), False, "model.pt is empty"),
    ((OutputFile("model.pt", 10, 50.0),), False,
     "model.pt was not written during the run (it is older than the trial's first attempt)"),
])
def test_outputs_check(outputs: tuple[OutputFile, ...], passed: bool, detail: str) -> None:
    config = VerifyConfig(require_checkpoint=False, outputs=[o.path for o in outputs])
    verdict = verify(Evidence(outputs=outputs, started_at=100.0, progress=STEP_42), config,
                     None, searcher_length=STEPS_42)
    assert check_of(verdict, "outputs") == Check("outputs", passed, detail)
    assert verdict.verified is passed


def test_outputs_are_read_from_the_trials_working_directory(tmp_path: Path) -> None:
    workdir = tmp_path / "workdir"
    (workdir / "eval").mkdir(parents=True)
    (workdir / "model.pt").write_bytes(b"weights")
    (workdir / "eval" / "empty.json").write_bytes(b"")
    (workdir / "a-dir").mkdir()
    evidence = gather_evidence(tmp_path, [1], outputs=["model.pt", "eval/empty.json",
                                                       "a-dir", "missing.bin"])
    assert [(o.path, o.size) for o in evidence.outputs] == [
        ("model.pt", 7), ("eval/empty.json", 0), ("a-dir", None), ("missing.bin", None)]


# --- the planned end and the attempt that ended (issue 30) --------------------------------


def progress(training: tuple[int, int] | None = None, validation: tuple[int, int] | None = None,
             final: int | None = None, at: float | None = None, **extra: object) -> Progress:
    """(lowest, highest) step of each kind; the final attempt's highest step and time."""
    kinds = {k: v for k, v in (("training", training), ("validation", validation)) if v}
    return Progress(highest={k: v[1] for k, v in kinds.items()},
                    lowest={k: v[0] for k, v in kinds.items()}, final_attempt_step=final,
                    final_attempt_time=at, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(("evidence", "planned", "status", "detail"), [
    (Evidence(progress=progress(training=(0, 199))), Planned("steps", 200, "ctx.plan()"),
     "passed", "reached step 200 of 200 (ctx.plan())"),  # 0-based: step 199 is the 200th
    (Evidence(progress=progress(training=(1, 199))), Planned("steps", 200, "ctx.plan()"),
     "failed", "stopped at step 199 of 200 (99%; ctx.plan())"),
    (Evidence(progress=progress(training=(0, 139))), Planned("steps", 200, "ctx.plan()"),
     "failed", "stopped at step 140 of 200 (70%; ctx.plan())"),
    # the searcher's steps are validation's; a config's or a plan's the loop's own
    (Evidence(progress=progress(training=(0, 19), validation=(9, 19))),
     Planned("steps", 20, "verify.expected_length"), "passed",
     "reached step 20 of 20 (verify.expected_length)"),
    (Evidence(progress=progress(training=(0, 2879), validation=(1, 40))),
     Planned("steps", 64, "searcher.max_length", validation_steps=True), "failed",
     "stopped at step 40 of 64 (62%; searcher.max_length)"),
    (Evidence(progress=progress(training=(0, 2879), validation=(1, 40))),
     Planned("batches", 2880, "verify.expected_length"), "passed",
     "reached batch 2,880 of 2,880 (verify.expected_length)"),
    (Evidence(samples_by_epoch={1: 100, 2: 100, 3: 40}), Planned("epochs", 3, "ctx.plan()"),
     "failed", "stopped at epoch 2 of 3 (66%; ctx.plan())"),  # epoch 3 was cut short
    (Evidence(samples_by_epoch={1: 100, 2: 100, 3: 100}), Planned("records", 250, "ctx.plan()"),
     "passed", "reached record 300 of 250 (ctx.plan())"),
    (Evidence(), Planned("epochs", 3, "ctx.plan()"), "failed",
     "no progress in epochs was reported; 3 epochs planned (ctx.plan())"),
    # a time metric counts by its value, whatever the steps or the samples say
    (Evidence(progress=progress(validation=(230, 2300), validation_highest={"epochs": 20.0})),
     Planned("epochs", 20, "searcher.max_length", validation_steps=True, metric="epochs"),
     "passed", "reached epoch 20 of 20 (searcher.max_length)"),
    (Evidence(progress=progress(validation=(10, 70), validation_highest={"tokens_m": 7.9})),
     Planned("tokens_m", 20, "searcher.max_length", validation_steps=True, metric="tokens_m"),
     "failed", "stopped at tokens_m 7 of 20 (35%; searcher.max_length)"),
    (Evidence(progress=progress(validation=(10, 70)), samples_by_epoch={1: 9, 2: 9}),
     Planned("epochs", 2, "searcher.max_length", validation_steps=True, metric="epochs"),
     "failed", "no progress in epochs was reported; 2 epochs planned (searcher.max_length)"),
    (Evidence(), None, "not_run", "not run: no planned length (set verify.expected_length or "
                                  "searcher.max_length, or call ctx.plan() in the script)"),
])
def test_completed_check(evidence: Evidence, planned: Planned | None, status: str,
                         detail: str) -> None:
    check = check_of(verify(evidence, NO_CHECKS, None, searcher_length=planned), "completed")
    assert (check.status, check.detail) == (status, detail)


def test_the_closest_plan_wins_and_an_early_stop_is_a_planned_end() -> None:
    evidence = Evidence(progress=progress(validation=(1, 8)),
                        plan=Planned("steps", 8, "ctx.plan()"))
    searcher = Planned("steps", 64, "searcher.max_length")
    assert check_of(verify(evidence, NO_CHECKS, None, searcher_length=searcher),
                    "completed").detail == "reached step 8 of 8 (ctx.plan())"
    config = VerifyConfig(require_checkpoint=False, finite_metrics=False,
                          expected_length={"steps": 10})  # type: ignore[arg-type]
    assert check_of(verify(evidence, config, None), "completed").detail == (
        "stopped at step 8 of 10 (80%; verify.expected_length)")
    stopped = check_of(verify(evidence, config, None, early_stopped=True), "completed")
    assert (stopped.status, stopped.detail) == (
        "passed", "stopped early by the searcher (a planned end)")


WARM_40 = WarmStartFrom(40, "checkpoint step-000000000040-0a1b2c3d of trial 3")


@pytest.mark.parametrize(("reported", "samples", "passed"), [
    # restored the source's counter and trained nothing: one report at its step (Lightning's
    # validate() after a skipped fit, the HF Trainer's summary)
    (progress(validation=(40, 40), steps=frozenset({40})), {}, False),
    # a loop from restore().step that never ran: a report before it and one at its end
    (progress(validation=(30, 40), steps=frozenset({30, 40})), {}, False),
    (progress(validation=(30, 30), steps=frozenset({30})), {}, False),
    # went on past the source's step: it trained (the counter restored, a plan past it)
    (progress(training=(41, 60), steps=frozenset({41, 42, 43})), {}, True),
    (progress(validation=(60, 60), steps=frozenset({60})), {}, True),
    # counted from 0, a series of steps (the last one the source's own number)
    (progress(validation=(1, 40), steps=frozenset({1, 2, 3})), {}, True),
    (progress(validation=(20, 40), steps=frozenset({20, 40, 30})), {}, True),
    # one report, but samples counted: data went through the loop
    (progress(validation=(30, 30), steps=frozenset({30})), {0: 100}, True),
])
def test_a_warm_start_must_show_steps_of_its_own(reported: Progress, samples: dict[int, int],
                                                 passed: bool) -> None:
    """Issue 35: a warm-started trial whose script restored the source's step counter can
    reach its plan without training a step; its own training is a step past the source's,
    a series of steps, or samples counted."""
    planned = Planned("steps", 30, "the lightning integration")
    evidence = Evidence(progress=reported, samples_by_epoch=samples, warm_start=WARM_40)
    check = check_of(verify(evidence, NO_CHECKS, None, searcher_length=planned), "completed")
    assert check.passed is passed, check.detail
    if not passed:
        shown = " and ".join(str(s) for s in sorted(reported.steps))
        assert check.detail.startswith(
            "the trial started from the warm start's checkpoint step-000000000040-0a1b2c3d of "
            f"trial 3 at step 40 and reported step {shown} only, nothing past it: nothing "
            "shows it trained a step of its own.")
        assert "(30 steps; the lightning integration) does not pass step 40" in check.detail
    # the same reports without a warm start are judged as before
    cold = check_of(verify(Evidence(progress=reported, samples_by_epoch=samples), NO_CHECKS,
                           None, searcher_length=planned), "completed")
    assert cold.passed


def test_a_warm_starts_epochs_are_its_own_samples() -> None:
    """Epochs and records count the trial's own samples: the source's are not among them."""
    evidence = Evidence(samples_by_epoch={0: 50, 1: 50}, warm_start=WARM_40,
                        progress=progress(validation=(40, 40), steps=frozenset({40})))
    check = check_of(verify(evidence, NO_CHECKS, None,
                            searcher_length=Planned("epochs", 2, "ctx.plan()")), "completed")
    assert (check.status, check.detail) == ("passed", "reached epoch 2 of 2 (ctx.plan())")


PARENT_AT_2 = WarmStartFrom(40, "checkpoint step-000000000040-0a1b2c3d of trial 3 (its parent)",
                            SourceEpochs(whole=2, last=2))


@pytest.mark.parametrize(("samples", "source", "plan", "passed", "detail"), [
    # a PBT member (or a script that keeps the source's epoch counter): its parent trained
    # epochs 1 and 2 to the checkpoint it starts from, it trains 3 and 4
    ({3: 50, 4: 50}, PARENT_AT_2, 4, True, "reached epoch 4 of 4 (ctx.plan())"),
    # the parent numbered from 0 (epochs 0 and 1): its member goes on at 2
    ({2: 50, 3: 50}, dataclasses.replace(PARENT_AT_2, epochs=SourceEpochs(2, 1)), 4, True,
     "reached epoch 4 of 4 (ctx.plan())"),
    # its last epoch cut short, or a gap: only the whole ones count
    ({3: 50, 4: 20}, PARENT_AT_2, 4, False, "stopped at epoch 3 of 4"),
    ({3: 50, 5: 50}, PARENT_AT_2, 5, False, "stopped at epoch 2 of 5"),
    # numbered from past the parent's last epoch, or from its own arbitrary start: only the
    # epochs it shows are its own, never the numbers it skipped
    ({4: 50, 5: 50}, PARENT_AT_2, 5, False, "stopped at epoch 2 of 5"),
    ({9: 50, 10: 50}, PARENT_AT_2, 10, False, "stopped at epoch 2 of 10"),
    # redoing the parent's last epoch is not going on from it
    ({2: 50, 3: 50, 4: 50}, PARENT_AT_2, 5, False, "stopped at epoch 3 of 5"),
    # what the source trained is unknown (a checkpoint before its last, an old verdict)
    ({3: 50, 4: 50}, WARM_40, 4, False, "stopped at epoch 2 of 4"),
])
def test_a_warm_start_that_goes_on_counting_the_sources_epochs(
        samples: dict[int, int], source: WarmStartFrom, plan: int, passed: bool,
        detail: str) -> None:
    """A warm-started run's epochs count its source's only where they go on from the
    epochs its source's verdict counted: a script that starts at a high epoch number has
    trained the epochs it shows, no more."""
    evidence = Evidence(samples_by_epoch=samples, warm_start=source,
                        progress=progress(validation=(3, 4), steps=frozenset(samples)))
    verdict = verify(evidence, NO_CHECKS, None,
                     searcher_length=Planned("epochs", plan, "ctx.plan()"))
    check = check_of(verdict, "completed")
    assert check.passed is passed and check.detail.startswith(detail), check.detail
    # the verdict keeps what it counted, for a member that starts from this one
    assert verdict.epochs is not None and f"epoch {verdict.epochs.whole} of" in check.detail
    assert verdict.to_json()["epochs"] == verdict.epochs.to_json()
    # without a warm start, epochs 3 and 4 are two epochs
    cold = check_of(verify(Evidence(samples_by_epoch={3: 50, 4: 50}), NO_CHECKS, None,
                           searcher_length=Planned("epochs", 4, "ctx.plan()")), "completed")
    assert not cold.passed


@pytest.mark.parametrize("raw", [None, [], {}, {"whole": 2}, {"whole": "2", "last": 2},
                                 {"whole": 0, "last": 0}, {"whole": True, "last": 1}])
def test_a_verdicts_epochs_that_are_missing_or_malformed_credit_nothing(raw: object) -> None:
    assert SourceEpochs.from_json(raw) is None
    assert SourceEpochs.from_json({"whole": 4, "last": 3}) == SourceEpochs(4, 3)


def test_a_verdict_without_epochs_keeps_none() -> None:
    verdict = verify(Evidence(progress=progress(training=(1, 10), steps=frozenset({1, 10}))),
                     NO_CHECKS, None, searcher_length=Planned("steps", 10, "ctx.plan()"))
    assert verdict.epochs is None and "epochs" not in verdict.to_json()


def test_the_steps_kept_come_from_the_metrics_files_and_the_logs(tmp_path: Path) -> None:
    write_metrics(tmp_path, 1, 0, "".join(metric_line(s, {"loss": 1.0}) for s in (7, 7, 9)))
    evidence = gather_evidence(tmp_path, [1], log_metrics=LogMetricEvidence(
        steps=frozenset({3, 4, 5}), highest={"training": 5}, lowest={"training": 3}))
    assert evidence.progress.steps == frozenset({7, 9, 3})
    write_metrics(tmp_path, 1, 0, "".join(metric_line(s, {"loss": 1.0}) for s in range(50)))
    assert gather_evidence(tmp_path, [1]).progress.steps == frozenset({0, 1, 2})


def saved(step: int, attempt: int, at: float) -> CheckpointInfo:
    return CheckpointInfo(f"/run/checkpoints/step-{step:012d}-00000000", step, True, None,
                          attempt, at)


@pytest.mark.parametrize(("evidence", "status", "detail"), [
    # saves every 50 steps; trained to 240 after its last save at 200: within its period
    (Evidence(checkpoints=(saved(150, 2, 10.0), saved(200, 2, 20.0)), final_attempt=2,
              progress=progress(training=(0, 240), final=240, at=28.0)), "passed",
     "attempt 2 saved step 200 (step-000000000200-00000000); it reported up to step 240"),
    (Evidence(checkpoints=(saved(100, 2, 10.0), saved(150, 2, 20.0)), final_attempt=2,
              progress=progress(training=(0, 240), final=240, at=40.0)), "failed",
     "attempt 2's latest checkpoint is step 150, but it went on to step 240 (it saves every "
     "50 steps): its last training was not saved"),
    (Evidence(checkpoints=(saved(200, 1, 20.0),), final_attempt=2,
              progress=progress(training=(0, 220), final=220, at=40.0)), "failed",
     "attempt 2 saved no checkpoint, though it trained to step 220; the latest "
     "(step-000000000200-00000000) is from attempt 1"),
    # the final attempt only restored the last checkpoint and ended: nothing was lost
    (Evidence(checkpoints=(saved(200, 1, 20.0),), final_attempt=2,
              progress=progress(training=(0, 200))), "passed",
     "attempt 2 reported no progress; the latest checkpoint (step-000000000200-00000000) "
     "holds the training reported before it"),
    # a save the harness saw fail, never followed by one that succeeded
    (Evidence(checkpoints=(saved(150, 1, 10.0), saved(200, 1, 20.0)), final_attempt=1,
              progress=progress(training=(0, 250), final=250, at=31.0),
              save_failures=(SaveFailure(0, 250, 30.0, "No space left on device"),),
              save_failure_count=1), "failed",
     "the save of step 250 (rank 0) failed: No space left on device; no later save "
     "succeeded, so the training after it was not kept"),
    (Evidence(checkpoints=(saved(200, 1, 20.0), saved(250, 1, 31.0)), final_attempt=1,
              progress=progress(training=(0, 250), final=250, at=31.0),
              save_failures=(SaveFailure(0, 250, 30.0, "No space left on device"),),
              save_failure_count=1), "passed",
     "attempt 1 saved step 250 (step-000000000250-00000000); it reported up to step 250"),
])
def test_checkpoint_fresh_check(evidence: Evidence, status: str, detail: str) -> None:
    check = check_of(verify(evidence, VerifyConfig(require_checkpoint=True), None),
                     "checkpoint_fresh")
    assert (check.status, check.detail) == (status, detail)


@pytest.mark.parametrize(("outputs", "status", "detail"), [
    ((OutputFile("model.pt", 10, 200.0, unchanged=False),), "passed",
     "1 file written by attempt 2: model.pt"),
    ((OutputFile("model.pt", 10, 200.0, unchanged=True),), "failed",
     "model.pt: not written by attempt 2, the one that ended (it is the file an earlier "
     "attempt left)"),
    ((OutputFile("model.pt", 10, 200.0),), "not_run",
     "not run: no record of the outputs as attempt 2 started"),
])
def test_outputs_fresh_check(outputs: tuple[OutputFile, ...], status: str, detail: str) -> None:
    config = VerifyConfig(require_checkpoint=False, outputs=[o.path for o in outputs])
    check = check_of(verify(Evidence(outputs=outputs, final_attempt=2, started_at=100.0),
                            config, None), "outputs_fresh")
    assert (check.status, check.detail) == (status, detail)


CRASH = Finding("traceback", 1200, "ValueError: bad batch", time=50.0)


@pytest.mark.parametrize(("scans", "prog", "mode", "status", "detail"), [
    ((RankScan(0),), Progress(), "suspect", "passed",
     "no traceback, KeyboardInterrupt or CUDA/NCCL error in 1 rank log"),
    ((RankScan(0, (CRASH,), 1),), Progress(rank_times={0: 40.0}), "suspect", "failed",
     "the log ends in an error after the last progress: rank 0, log offset 1,200: "
     "ValueError: bad batch; verify.log_errors: warn only warns"),
    ((RankScan(0, (CRASH,), 1),), Progress(rank_times={0: 40.0}), "warn", "warning",
     "warning: the log ends in an error after the last progress: rank 0, log offset 1,200: "
     "ValueError: bad batch"),
    # progress reported after it: the script went on from it
    ((RankScan(0, (CRASH,), 1),), Progress(rank_times={0: 60.0}), "suspect", "warning",
     "warning: an error the run went on from: rank 0, log offset 1,200: ValueError: bad batch"),
    ((RankScan(1, (CRASH,), 1),), Progress(rank_offsets={1: 5000}), "suspect", "warning",
     "warning: an error the run went on from: rank 1, log offset 1,200: ValueError: bad batch"),
    ((RankScan(0, problem="scanning the log took longer than 60 s"),), Progress(), "suspect",
     "not_run", "not run: rank 0: scanning the log took longer than 60 s"),
])
def test_log_errors_check(scans: tuple[RankScan, ...], prog: Progress, mode: str, status: str,
                          detail: str) -> None:
    config = VerifyConfig(require_checkpoint=False, log_errors=mode)  # type: ignore[arg-type]
    check = check_of(verify(Evidence(log_scans=scans, progress=prog), config, None),
                     "log_errors")
    assert (check.status, check.detail) == (status, detail)


def test_a_peers_error_after_the_primary_exited_0_is_its_teardown() -> None:
    scans = (RankScan(0), RankScan(1, (CRASH,), 1))
    late = check_of(verify(Evidence(log_scans=scans, primary_ended_at=45.0), NO_CHECKS, None),
                    "log_errors")
    assert (late.status, late.detail) == (
        "warning", "warning: an error the run went on from: rank 1, log offset 1,200: "
                   "ValueError: bad batch (after rank 0 had exited 0)")
    early = check_of(verify(Evidence(log_scans=scans, primary_ended_at=55.0), NO_CHECKS, None),
                     "log_errors")
    assert early.status == "failed"


def test_resume_accounting_names_the_epochs_no_attempt_trained(tmp_path: Path) -> None:
    write_samples(tmp_path, 1, 0, {1: 100, 2: 100, 3: 100})
    write_samples(tmp_path, 2, 0, {3: 100, 4: 100})  # epoch 3 redone: counted once
    write_samples(tmp_path, 3, 0, {7: 100})  # a resume that jumped to epoch 7
    evidence = gather_evidence(tmp_path, [1, 2, 3])
    assert evidence.epochs_by_attempt == {1: (1, 2, 3), 2: (3, 4), 3: (7,)}
    check = check_of(verify(evidence, NO_CHECKS, 100), "resume_accounting")
    assert (check.status, check.detail) == ("failed", (
        "epoch 5 was never trained (attempt 2 reported up to epoch 4, attempt 3 went on from "
        "epoch 7); epoch 6 was never trained (attempt 2 reported up to epoch 4, attempt 3 "
        "went on from epoch 7)"))


def test_the_harness_plan_and_save_failures_are_read_from_the_run_directory(
    tmp_path: Path
) -> None:
    attempt = tmp_path / "attempt-1"
    attempt.mkdir()
    (attempt / "rank-0.plan.json").write_text('{"unit": "epochs", "length": 6}')
    (attempt / "rank-0.save-failures.json").write_text(
        '{"count": 2, "failures": [{"step": 9, "time": 5.0, "error": "ENOSPC"}]}' + " " * 50)
    (attempt / "rank-1.save-failures.json").write_text("{not json")
    evidence = gather_evidence(tmp_path, [1])
    assert evidence.plan == Planned("epochs", 6, "ctx.plan()")
    assert evidence.save_failure_count == 3
    assert evidence.save_failures[0] == SaveFailure(0, 9, 5.0, "ENOSPC")
    assert evidence.save_failures[1].rank == 1
