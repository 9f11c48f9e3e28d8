"""Reading the ranks' diagnostics files (`read_rank_records`) from real files laid out as an
attempt directory, and the coded-bias checks as `verify` reports them."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import muster.diagnostics
from muster.config import DiagnosticsConfig
from muster.diagnostics import MAX_RECORD_BYTES, read_rank_records
from muster.diagnostics.bias import RankRecords, parse_records
from muster.rundir import AttemptDir, RunDir
from muster.supervise.verification import (
    Check,
    Evidence,
    MetricPoint,
    Verdict,
    VerifyConfig,
    verify,
)

SAMPLER = {"kind": "sampler", "sampler": 0, "type": "RandomSampler", "random": True,
           "partitioned": False, "replacement": False, "generator_seed": 42,
           "torch_initial": 1, "dataset": {"type": "TensorDataset", "size": 8}}
PASS = {"kind": "pass", "sampler": 0, "pass": 0, "epoch": None, "count": 8, "complete": True,
        "indices": [3, 1, 4, 0, 5, 2, 6, 7]}
UPDATE = {"kind": "update", "update": 0, "grad_norm": 1.5, "grad_finite": True, "hash": [9]}


def line(document: Any) -> bytes:
    return json.dumps(document).encode() + b"\n"


@pytest.fixture
def attempt(tmp_path: Path) -> AttemptDir:
    found = RunDir(tmp_path / "run").attempt(1)
    found.path.mkdir(parents=True)
    return found


def write_rank(attempt: AttemptDir, rank: int, data: bytes) -> Path:
    path = attempt.rank(rank).diagnostics
    path.write_bytes(data)
    return path


def test_every_rank_file_is_read_by_rank(attempt: AttemptDir) -> None:
    write_rank(attempt, 0, line(SAMPLER) + line(PASS) + line(UPDATE))
    write_rank(attempt, 1, line(SAMPLER))
    found = read_rank_records(attempt.path)
    assert sorted(found) == [0, 1]
    assert found[0].samplers[0]["generator_seed"] == 42
    assert found[0].passes[(0, 0)]["indices"] == PASS["indices"]
    assert found[0].updates[0]["grad_norm"] == 1.5
    assert found[1].passes == {}


def test_no_attempt_directory_is_no_records(tmp_path: Path) -> None:
    assert read_rank_records(tmp_path / "missing") == {}


def test_malformed_and_non_object_lines_are_skipped_with_a_warning(
        attempt: AttemptDir, caplog: pytest.LogCaptureFixture) -> None:
    path = write_rank(attempt, 0, line(SAMPLER) + b"{not json\n" + line([1, 2, 3])
                      + line("a string") + b"\xff\xfe\n" + b"\n" + line(PASS))
    with caplog.at_level(logging.WARNING, logger="muster.diagnostics"):
        found = read_rank_records(attempt.path)
    assert list(found[0].samplers) == [0]
    assert list(found[0].passes) == [(0, 0)]
    [warning] = caplog.messages
    assert str(path) in warning
    assert "3 diagnostics lines skipped" in warning  # the bad JSON, the bad UTF-8, the blank


def test_a_line_over_the_bound_is_skipped_and_the_lines_after_it_read(
        attempt: AttemptDir, caplog: pytest.LogCaptureFixture) -> None:
    huge = {**PASS, "pass": 1, "indices": [], "padding": "x" * (2 << 20)}
    write_rank(attempt, 0, line(SAMPLER) + line(huge) + line(PASS) + line(UPDATE))
    with caplog.at_level(logging.WARNING, logger="muster.diagnostics"):
        found = read_rank_records(attempt.path)
    assert list(found[0].passes) == [(0, 0)]
    assert list(found[0].updates) == [0]
    assert any("1 diagnostics line skipped" in m and "over 1048576 bytes" in m
               for m in caplog.messages)


@pytest.mark.parametrize(("size", "kept"), [
    (MAX_RECORD_BYTES, True),  # the newline included
    (MAX_RECORD_BYTES + 1, False),
], ids=["at-the-bound", "one-byte-over"])
def test_the_line_bound_includes_the_newline(attempt: AttemptDir, size: int, kept: bool) -> None:
    record = {"kind": "update", "update": 1, "pad": ""}
    record["pad"] = "x" * (size - len(line(record)))
    data = line(record)
    assert len(data) == size
    write_rank(attempt, 0, data + line(UPDATE))
    found = read_rank_records(attempt.path)
    assert sorted(found[0].updates) == ([0, 1] if kept else [0])


def test_a_file_cut_off_mid_line_keeps_its_whole_lines(
        attempt: AttemptDir, caplog: pytest.LogCaptureFixture) -> None:
    write_rank(attempt, 0, line(SAMPLER) + line(PASS) + line(UPDATE)[:-7])
    with caplog.at_level(logging.WARNING, logger="muster.diagnostics"):
        found = read_rank_records(attempt.path)
    assert (list(found[0].samplers), list(found[0].passes)) == ([0], [(0, 0)])
    assert found[0].updates == {}
    assert any("1 diagnostics line skipped" in m for m in caplog.messages)


def test_a_cut_off_json_object_that_parses_is_still_skipped(attempt: AttemptDir) -> None:
    # `{"kind": "update", "update": 0}` is whole JSON, but with no newline a writer may be
    # half way through a longer record: the line is not taken.
    write_rank(attempt, 0, line(SAMPLER) + json.dumps(UPDATE).encode())
    assert read_rank_records(attempt.path)[0].updates == {}


def test_reading_stops_at_the_file_bound(attempt: AttemptDir,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    first = line(SAMPLER) + line(PASS)
    monkeypatch.setattr(muster.diagnostics, "MAX_DIAGNOSTICS_BYTES", len(first))
    write_rank(attempt, 0, first + line(UPDATE))
    found = read_rank_records(attempt.path)
    assert list(found[0].passes) == [(0, 0)]
    assert found[0].updates == {}


def test_a_symlink_instead_of_the_file_is_not_followed(attempt: AttemptDir,
                                                       tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(line(SAMPLER))
    attempt.rank(0).diagnostics.symlink_to(elsewhere)
    write_rank(attempt, 1, line(SAMPLER))
    assert sorted(read_rank_records(attempt.path)) == [1]


def test_a_fifo_instead_of_the_file_is_refused_without_blocking(attempt: AttemptDir) -> None:
    os.mkfifo(attempt.rank(0).diagnostics)
    write_rank(attempt, 1, line(SAMPLER))
    found: dict[int, RankRecords] = {}
    reader = threading.Thread(target=lambda: found.update(read_rank_records(attempt.path)),
                              daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # unblock the reader before failing, so no thread is left behind
        os.close(os.open(attempt.rank(0).diagnostics, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("read_rank_records blocked on a FIFO")
    assert sorted(found) == [1]


def test_a_directory_instead_of_the_file_is_left_out(attempt: AttemptDir) -> None:
    attempt.rank(0).diagnostics.mkdir()
    write_rank(attempt, 1, line(SAMPLER))
    assert sorted(read_rank_records(attempt.path)) == [1]


def test_an_unreadable_file_is_left_out_with_a_warning(
        attempt: AttemptDir, caplog: pytest.LogCaptureFixture) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a file without read permission")
    write_rank(attempt, 0, line(SAMPLER)).chmod(0)
    write_rank(attempt, 1, line(SAMPLER))
    with caplog.at_level(logging.WARNING, logger="muster.diagnostics"):
        assert sorted(read_rank_records(attempt.path)) == [1]
    assert any("rank 0's diagnostics" in m for m in caplog.messages)


def test_unrelated_files_are_ignored(attempt: AttemptDir) -> None:
    write_rank(attempt, 2, line(SAMPLER))
    for name in ("rank-0.metrics.jsonl", "rank-0.diagnostics.jsonl.bak", "rank-x.diagnostics.jsonl",
                 "diagnostics.jsonl", "rank-1.diagnostics.json", "notes.txt"):
        (attempt.path / name).write_bytes(line(SAMPLER))
    (attempt.path / "restarts").mkdir()
    (attempt.path / "restarts" / "rank-0.diagnostics.jsonl").write_bytes(line(SAMPLER))
    assert sorted(read_rank_records(attempt.path)) == [2]


def test_an_empty_file_is_a_rank_with_no_records(attempt: AttemptDir) -> None:
    write_rank(attempt, 0, b"")
    assert read_rank_records(attempt.path) == {0: RankRecords()}


# --- verify: the diagnostics checks -------------------------------------------------------

NO_CHECKS = VerifyConfig(require_checkpoint=False, finite_metrics=False)


def rank_lines(generator_seed: int, indices: list[int], finite: bool = True) -> RankRecords:
    return parse_records([
        {**SAMPLER, "generator_seed": generator_seed},
        {**PASS, "indices": indices},
        {"kind": "params", "names": ["w"], "replicated": True},
        {**UPDATE, "grad_finite": finite, "grad_norm": 1.0 if finite else None},
    ])


# Both ranks draw the same permutation with one seed: sampler_overlap and rank_seeds find it.
BIASED = {0: rank_lines(42, list(range(8))), 1: rank_lines(42, list(range(8)))}
CLEAN = {0: rank_lines(1, [0, 2, 4, 6]), 1: rank_lines(2, [1, 3, 5, 7])}


def diagnostics_checks(verdict: Verdict) -> dict[str, Check]:
    return {c.name: c for c in verdict.checks if c.name.startswith("diagnostics.")}


def test_clean_ranks_pass_every_diagnostics_check() -> None:
    verdict = verify(Evidence(rank_diagnostics=CLEAN), NO_CHECKS, None)
    checks = diagnostics_checks(verdict)
    assert sorted(checks) == ["diagnostics.finite_all_ranks", "diagnostics.grad_norm_spread",
                              "diagnostics.rank_seeds", "diagnostics.replica_hash",
                              "diagnostics.sample_balance", "diagnostics.sampler_overlap"]
    assert verdict.passed
    assert all(c.passed and not c.detail.startswith("warning") for c in checks.values())


@pytest.mark.parametrize(("mode", "passed", "prefix"), [
    ("suspect", False, ""),
    ("warn", True, "warning: "),
])
def test_a_finding_is_judged_as_its_mode_says(mode: str, passed: bool, prefix: str) -> None:
    config = DiagnosticsConfig(sampler_overlap=mode, rank_seeds="off")  # type: ignore[arg-type]
    verdict = verify(Evidence(rank_diagnostics=BIASED), NO_CHECKS, None, diagnostics=config)
    checks = diagnostics_checks(verdict)
    assert "diagnostics.rank_seeds" not in checks
    overlap = checks["diagnostics.sampler_overlap"]
    assert overlap.passed is passed
    assert verdict.passed is passed
    assert overlap.detail.startswith(f"{prefix}pass 0: ranks 0 and 1 drew 100%")


def test_off_leaves_the_check_out() -> None:
    config = DiagnosticsConfig(sampler_overlap="off", rank_seeds="off")
    verdict = verify(Evidence(rank_diagnostics=BIASED), NO_CHECKS, None, diagnostics=config)
    assert verdict.passed
    assert "diagnostics.sampler_overlap" not in diagnostics_checks(verdict)


def test_the_defaults_make_a_seed_finding_suspect() -> None:
    verdict = verify(Evidence(rank_diagnostics=BIASED), NO_CHECKS, None)
    checks = diagnostics_checks(verdict)
    assert not verdict.passed
    assert not checks["diagnostics.rank_seeds"].passed
    assert "same seed 42" in checks["diagnostics.rank_seeds"].detail


def test_warn_by_default_for_balance_and_epoch_order() -> None:
    repeated = parse_records([{**SAMPLER, "generator_seed": 1},
                              {**PASS, "indices": [0, 2, 4, 6]},
                              {**PASS, "pass": 1, "indices": [0, 2, 4, 6]}])
    short = parse_records([{**SAMPLER, "generator_seed": 2},
                           {**PASS, "indices": [1, 3], "count": 2}])
    uneven = {0: repeated, 1: short}
    checks = diagnostics_checks(verify(Evidence(rank_diagnostics=uneven), NO_CHECKS, None))
    balance = checks["diagnostics.sample_balance"]
    assert balance.passed and balance.detail.startswith("warning: pass 0: rank 0 drew 8")
    order = checks["diagnostics.epoch_order"]
    assert order.passed and order.detail.startswith("warning: rank 0's RandomSampler")


def test_the_bounds_come_from_the_config() -> None:
    shared = {0: rank_lines(1, [0, 1, 2, 3]), 1: rank_lines(2, [2, 3, 4, 5])}  # 50% alike
    loose = diagnostics_checks(verify(Evidence(rank_diagnostics=shared), NO_CHECKS, None))
    assert loose["diagnostics.sampler_overlap"].passed
    strict = diagnostics_checks(verify(Evidence(rank_diagnostics=shared), NO_CHECKS, None,
                                       diagnostics=DiagnosticsConfig(overlap_bound=0.4)))
    assert not strict["diagnostics.sampler_overlap"].passed


def test_a_non_finite_metric_of_the_final_attempt_joins_finite_all_ranks() -> None:
    evidence = Evidence(
        rank_diagnostics=CLEAN, final_attempt=2,
        non_finite=(MetricPoint("training", 5, "loss", math.nan, attempt=2, rank=1),
                    MetricPoint("training", 1, "loss", math.inf, attempt=1, rank=0)))
    check = diagnostics_checks(verify(evidence, NO_CHECKS, None))["diagnostics.finite_all_ranks"]
    assert not check.passed
    assert "rank 1: reported loss was NaN at step 5" in check.detail
    assert "finite on rank 0" in check.detail  # attempt 1's Infinity is not this attempt's


def test_a_non_finite_gradient_is_suspect_by_default() -> None:
    ranks = {0: rank_lines(1, [0, 2, 4, 6]), 1: rank_lines(2, [1, 3, 5, 7], finite=False)}
    check = diagnostics_checks(verify(Evidence(rank_diagnostics=ranks), NO_CHECKS, None)
                               )["diagnostics.finite_all_ranks"]
    assert not check.passed
    assert "rank 1: its local gradient was not finite at update 0" in check.detail


def test_no_diagnostics_no_checks() -> None:
    verdict = verify(Evidence(), NO_CHECKS, None,
                     diagnostics=DiagnosticsConfig(sampler_overlap="suspect"))
    assert diagnostics_checks(verdict) == {}
