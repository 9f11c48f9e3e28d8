"""The run directory's names: one place spells them, and every listing finds what it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.rundir import (
    BUNDLE_ID,
    CONTROL_FILES,
    LOCAL_RUN_DIR,
    RankFile,
    RankFiles,
    RunDir,
    every_rank_file,
    new_bundle_id,
)


def test_the_layout_as_docs_run_directory_describes_it(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "runs" / "uuid")
    attempt = run.attempt(3)
    files = attempt.rank(2)
    assert run.checkpoints == run.path / "checkpoints"
    assert attempt.path == run.path / "attempt-3" and attempt.run == run
    assert attempt.hparams == attempt.path / "hparams.json"
    assert files == RankFiles(attempt.path, 2)
    assert {kind: files.path(kind).name for kind in RankFile} == {
        RankFile.LOG: "rank-2.log", RankFile.INDEX: "rank-2.index",
        RankFile.DROPPED: "rank-2.log.dropped",
        RankFile.SPEC: "rank-2.spec.json", RankFile.LAUNCH: "rank-2.launch.json",
        RankFile.STATUS: "rank-2.shim.json", RankFile.ALIVE: "rank-2.alive",
        RankFile.ACTIVE: "rank-2.active",
        RankFile.EXIT: "rank-2.exit.json", RankFile.EXIT_RESERVE: "rank-2.exit.reserve",
        RankFile.STOP: "rank-2.stop", RankFile.SHIM_LOG: "rank-2.shim.log",
        RankFile.STALLED: "rank-2.stalled.json", RankFile.STANDBY_GO: "rank-2.standby-go.json",
        RankFile.HEARTBEAT: "rank-2.heartbeat.json", RankFile.METRICS: "rank-2.metrics.jsonl",
        RankFile.SYSTEM: "rank-2.system.jsonl",
        RankFile.SAMPLES: "rank-2.samples.json", RankFile.STOP_ACK: "rank-2.stop-ack.json",
        RankFile.SNAPSHOT: "rank-2.snapshot.json", RankFile.DIAGNOSTICS: "rank-2.diagnostics.jsonl",
        RankFile.PLAN: "rank-2.plan.json", RankFile.SAVE_FAILURES: "rank-2.save-failures.json",
        RankFile.DUMP: "rank-2.dump.json", RankFile.STACK_SIGNAL: "rank-2.stack-signal.json",
        RankFile.FAULTHANDLER: "rank-2.faulthandler.txt",
        RankFile.DRILL_NAN: "rank-2.drill-nan", RankFile.DRILL_NAN_DONE: "rank-2.drill-nan.done",
    }
    assert (files.log, files.exit, files.metrics) == (
        files.path(RankFile.LOG), files.path(RankFile.EXIT), files.path(RankFile.METRICS))
    assert files.archived(RankFile.EXIT, 1) == attempt.restarts / "rank-2.exit.json.1"
    assert LOCAL_RUN_DIR == "muster-run"
    assert files.dump == attempt.path / "rank-2.dump.json"
    assert attempt.evidence_of("20250101T120000Z-stalled", 2) == (
        attempt.path / "evidence" / "20250101T120000Z-stalled" / "rank-2")


def test_bundle_ids_sort_by_time_and_say_why() -> None:
    assert new_bundle_id("stalled", now=0) == "19700101T000000Z-stalled"
    assert BUNDLE_ID.fullmatch(new_bundle_id("requested"))
    for reason in ("", "../x", "Stalled", "x" * 33):
        with pytest.raises(ValueError, match="reason"):
            new_bundle_id(reason)


@pytest.mark.parametrize("bundle", [
    "../x", "20250101T120000Z-stalled/..", "/tmp", "", "20250101T120000Z-", ".",
    "20250101T120000Z-Stalled", "20250101T120000Z-stalled\n"])
def test_a_malformed_bundle_id_never_becomes_a_path(tmp_path: Path, bundle: str) -> None:
    with pytest.raises(ValueError, match="evidence bundle id"):
        RunDir(tmp_path).attempt(1).evidence_of(bundle, 0)


def test_control_files_exclude_what_the_next_incarnation_appends_to() -> None:
    assert RankFile.LOG not in CONTROL_FILES and RankFile.INDEX not in CONTROL_FILES
    assert RankFile.METRICS not in CONTROL_FILES and RankFile.SAMPLES not in CONTROL_FILES
    assert {RankFile.EXIT, RankFile.STATUS, RankFile.HEARTBEAT, RankFile.STALLED} <= set(
        CONTROL_FILES)


@pytest.mark.parametrize("kind", list(RankFile))
def test_ranks_with_lists_every_rank_of_one_kind(tmp_path: Path, kind: RankFile) -> None:
    attempt = RunDir(tmp_path).attempt(1)
    attempt.path.mkdir()
    for rank in (10, 2, 0):
        attempt.rank(rank).path(kind).write_text("x")
    (attempt.path / f"rank-x.{kind.value}").write_text("not a rank")
    (attempt.path / f"rank-1.{kind.value}.tmp").write_text("another kind")
    (attempt.path / f"rank-3.{kind.value}").mkdir()  # not a file
    assert attempt.ranks_with(kind) == [(r, attempt.rank(r).path(kind)) for r in (0, 2, 10)]


def test_listings_of_what_is_not_there_yet_are_empty(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "missing")
    assert run.attempt_numbers() == [] and run.attempt(1).ranks_with(RankFile.LOG) == []
    assert list(every_rank_file(tmp_path / "missing", RankFile.STATUS)) == []


def test_every_rank_file_walks_trials_attempts_and_ranks(tmp_path: Path) -> None:
    expected = []
    for trial in ("a", "b"):
        run = RunDir(tmp_path / trial)
        for number in (1, 2):
            files = run.attempt(number).rank(number - 1)
            files.attempt_dir.mkdir(parents=True)
            files.status.write_text("{}")
            files.log.write_text("")
            expected.append(files.status)
    (tmp_path / "a" / "attempt-x").mkdir()
    assert RunDir(tmp_path / "a").attempt_numbers() == [1, 2]
    assert list(every_rank_file(tmp_path, RankFile.STATUS)) == expected


def test_rank_files_of_several_kinds_come_from_one_listing(tmp_path: Path) -> None:
    attempt = RunDir(tmp_path).attempt(1)
    attempt.path.mkdir()
    for name in ("rank-1.system.jsonl", "rank-0.metrics.jsonl", "rank-0.system.jsonl",
                 "rank-1.log", "rank-10.metrics.jsonl"):
        (attempt.path / name).write_text("")
    assert attempt.rank_files((RankFile.METRICS, RankFile.SYSTEM)) == [
        (RankFile.METRICS, 0, attempt.rank(0).metrics),
        (RankFile.METRICS, 10, attempt.rank(10).metrics),
        (RankFile.SYSTEM, 0, attempt.rank(0).system),
        (RankFile.SYSTEM, 1, attempt.rank(1).system)]
    assert RunDir(tmp_path).attempt(2).rank_files((RankFile.LOG,)) == []
