"""The retention planner (`muster.checkpoint_storage.retention`) as a table: what goes of a
trial of an ended experiment, by its age, its state and what holds it; the words its events
and readers use; and the bounded walk that sizes a run directory (real files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from muster.checkpoint_storage.retention import (
    Decision,
    Line,
    Rules,
    TrialFacts,
    decide,
    event_message,
    experiment_kept,
    files_gone,
    logs_gone,
)
from muster.checkpoint_storage.retention_sweep import measure_tree
from muster.config.cluster import RetentionConfig
from muster.states import RetentionItem, TrialState

DAY = 86400.0
RULES = Rules(logs_after=90 * DAY, runs_after=180 * DAY, keep_labels=frozenset({"keep"}))
ENDED = 1_000_000_000.0
REGISTERED = "checkpoint step-3-ab: registered as digits v1: the registry holds it"
WARM = "checkpoint step-3-ab: experiment 9 starts its trials from it and has not ended"
LOGS_RULE, RUNS_RULE = "retention.logs_after 90d", "retention.runs_after 180d"
S, F, C, P = TrialState.SUCCEEDED, TrialState.FAILED, TrialState.CANCELED, TrialState.SUSPECT


def _trial(state: TrialState = S, holds: tuple[str, ...] = (), pending: bool = False
           ) -> TrialFacts:
    return TrialFacts(7, ENDED, state, holds, pending)


# (days since its experiment ended, the trial, rules) -> (scope, rule, kept)
TABLE = [
    # younger than every rule: nothing to say
    (89, _trial(), RULES, None),
    # past logs_after: its logs, whatever its end
    (90, _trial(), RULES, (RetentionItem.LOGS, LOGS_RULE, None)),
    (179, _trial(F), RULES, (RetentionItem.LOGS, LOGS_RULE, None)),
    # past runs_after: its whole run
    (180, _trial(C), RULES, (RetentionItem.RUN, RUNS_RULE, None)),
    (4000, _trial(), RULES, (RetentionItem.RUN, RUNS_RULE, None)),
    # a held checkpoint keeps the run; the logs still go
    (200, _trial(holds=(REGISTERED,)), RULES,
     (RetentionItem.LOGS, LOGS_RULE, f"its run stays: {REGISTERED} (retention.keep_registered)")),
    (200, _trial(holds=(WARM,)), Rules(None, 180 * DAY, keep_registered=False),
     (None, "", f"its run stays: {WARM}")),
    # artifacts still being copied: the run waits for the next sweep
    (200, _trial(pending=True), RULES,
     (RetentionItem.LOGS, LOGS_RULE, "its artifacts are still being collected")),
    # a trial that has not ended loses nothing, and says why
    (400, _trial(P), RULES, (None, "", "SUSPECT: its evidence stays until it is reviewed")),
    (400, _trial(TrialState.RUNNING), RULES, (None, "", "RUNNING: it has not ended")),
    # one rule alone
    (100, _trial(), Rules(logs_after=90 * DAY), (RetentionItem.LOGS, LOGS_RULE, None)),
    (5000, _trial(), Rules(logs_after=90 * DAY), (RetentionItem.LOGS, LOGS_RULE, None)),
    (100, _trial(), Rules(runs_after=180 * DAY), None),
    (180, _trial(), Rules(runs_after=180 * DAY), (RetentionItem.RUN, RUNS_RULE, None)),
]


@pytest.mark.parametrize(("days", "trial", "rules", "expected"), TABLE)
def test_what_goes_of_a_trial(days: float, trial: TrialFacts, rules: Rules,
                              expected: tuple[RetentionItem | None, str, str | None] | None
                              ) -> None:
    decision = decide(trial, rules, ENDED + days * DAY)
    assert decision == (None if expected is None else Decision(7, *expected))


def test_a_label_keeps_the_whole_experiment() -> None:
    assert experiment_kept(["demo", "keep"], RULES) == "labelled 'keep' (retention.keep_labels)"
    assert experiment_kept(["demo"], RULES) is None
    assert experiment_kept([], Rules(runs_after=DAY)) is None


def test_rules_of_the_cluster_config() -> None:
    assert Rules.of(None) is None
    assert Rules.of(RetentionConfig(keep_labels=["keep"])) is None  # no age: nothing goes
    rules = Rules.of(RetentionConfig.model_validate(
        {"logs_after": "1s", "runs_after": "2s", "keep_registered": False}))
    assert rules == Rules(1.0, 2.0, keep_registered=False)
    assert rules.youngest == 1.0
    assert Rules(runs_after=3.0).youngest == 3.0


def test_the_event_names_each_line_its_size_and_the_rule() -> None:
    def line(what: RetentionItem, name: str | None, size: int, files: int,
             at_least: bool = False) -> Line:
        return Line(what, 3, "digits", 7, name, size, files, at_least, ENDED, RUNS_RULE)

    message = event_message([line(RetentionItem.RUN, None, 5 << 20, 100_000, at_least=True),
                             line(RetentionItem.CHECKPOINT, "step-3-ab", 51_200, 2),
                             line(RetentionItem.ARTIFACTS, "attempt 1", 20_480, 1)])
    assert message == (
        "the run directory of trial 7 (at least 5 MiB in 100,000 files), checkpoint "
        "step-3-ab (50 KiB in 2 files), the artifacts of attempt 1 (20 KiB in 1 file) "
        "removed: experiment 3 (digits) ended 2001-09-09 01:46 UTC, past "
        "retention.runs_after 180d")


def test_readers_say_when_and_by_which_rule() -> None:
    removed = ENDED + 92 * DAY
    assert logs_gone(7, None, None, ENDED) is None
    assert files_gone(7, None, ENDED) is None
    assert logs_gone(7, removed, None, ENDED) == (
        "trial 7's logs were removed by retention on 2001-12-10 01:46 UTC, 92d 0h after its "
        "experiment ended (the cluster config's retention.logs_after); its metrics, "
        "checkpoints and events stay: `muster events --trial 7`")
    whole = files_gone(7, removed, ENDED)
    assert whole is not None and "retention.runs_after" in whole
    assert logs_gone(7, ENDED + DAY, removed, ENDED) == whole  # the run went, logs with it


def test_a_tree_is_measured_without_following_links_and_within_bounds(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "attempt-1").mkdir(parents=True)
    (run / "attempt-1" / "rank-0.log").write_bytes(b"x" * 1000)
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "checkpoints" / "step-1" / "model.bin").write_bytes(b"y" * 5000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"z" * 100_000)
    os.symlink(outside, run / "link")  # counted as a file of its own size, never walked

    size, files, at_least = measure_tree([run])
    assert (files, at_least) == (3, False)
    assert size == 6000 + os.lstat(run / "link").st_size
    skipped = measure_tree([run], {os.path.normpath(run / "checkpoints" / "step-1")})
    assert skipped[:2] == (1000 + os.lstat(run / "link").st_size, 2)
    assert measure_tree([run], limit=2)[1:] == (2, True)
    assert measure_tree([tmp_path / "absent"]) == (0, 0, False)
