"""The verdict on a trial whose primary replica exited 0 (invariant 1: no false success).

Plan, then act: `gather_evidence` reads the run directory (docs/run-directory.md) into plain
data, and `verify`, a pure function, decides. A trial whose verdict fails is SUSPECT with
the failed checks' details as its reasons.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from muster import checkpoint_files, metrics_lines
from muster.atomic import open_regular, read_json, read_regular
from muster.config import DiagnosticsConfig, VerifyConfig
from muster.config.schema import SearcherConfig
from muster.diagnostics import bias, diff, read_rank_parts, read_rank_records
from muster.launch.log_limit import read_drops
from muster.metrics_lines import MetricLine
from muster.rundir import RankFile, RunDir
from muster.sizes import format_size
from muster.states import CheckStatus, Integration, MetricKind
from muster.supervise.log_errors import Finding, RankScan
from muster.supervise.log_metrics import LogMetricEvidence
from muster.supervise.log_samples import LogSamples
from muster.words import NOT_VERIFIED, count, rank_list

__all__ = [
    "EMPTY_DATA",
    "NOT_VERIFIED",
    "RESULT_CHECKS",
    "Check",
    "CheckpointInfo",
    "Evidence",
    "LogCounts",
    "LogLoss",
    "MetricPoint",
    "OutputFile",
    "Planned",
    "Progress",
    "SaveFailure",
    "SourceEpochs",
    "Verdict",
    "VerifyConfig",
    "WarmStartFrom",
    "combine_log_counts",
    "gather_evidence",
    "output_identity",
    "outputs_as_found",
    "planned_length",
    "rank_differences",
    "read_plan",
    "read_samples",
    "searcher_length",
    "step_kinds",
    "steps_done",
    "verify",
    "whole_epochs",
]

MINUS = "\u2212"  # U+2212, a real minus sign for negative percentages
SHOWN_NON_FINITE = 5  # non-finite values named in a detail; the rest are counted
SHOWN_DIFFERENCES = 5  # rank differences named in consistent_ranks; the rest are counted
KEPT_NON_FINITE_PER_FILE = SHOWN_NON_FINITE  # enough to name the first ones of any file
EMPTY_DATA = ("the data manifest counts 0 files, so 0 samples were expected: an empty data "
              "set verifies nothing")


@dataclass(frozen=True)
class MetricPoint:
    """One reported metric value (here: only the non-finite ones are kept)."""

    kind: str
    step: int
    name: str
    value: float
    attempt: int
    rank: int


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    step: int
    intact: bool
    problem: str | None  # e.g. "model.pt does not match its sha256 in metadata.json"
    attempt: int | None = None  # the attempt that saved it (metadata.json)
    saved_at: float | None = None  # when (metadata.json's "time")

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class OutputFile:
    """A file the config says the run must write (`verify.outputs`), as found."""

    path: str  # as the config names it, relative to the trial's working directory
    size: int | None  # None: missing (or not a regular file)
    modified_at: float | None
    # Whether it is the very file the final attempt found when it started (same inode, size,
    # modification and change times); None when muster has no record of that.
    unchanged: bool | None = None


@dataclass(frozen=True)
class SaveFailure:
    """A checkpoint save the harness saw fail (`rank-<r>.save-failures.json`)."""

    rank: int
    step: int
    time: float
    error: str


@dataclass(frozen=True)
class Progress:
    """How far the run got, from what it reported (harness metrics; log metrics)."""

    # The highest step of each kind ("training", "validation") over every attempt, and
    # the lowest (a run that numbers its steps from 0 has done max + 1 of them).
    highest: Mapping[str, int] = field(default_factory=dict)
    lowest: Mapping[str, int] = field(default_factory=dict)
    final_attempt_step: int | None = None  # the final attempt's highest step, any kind
    final_attempt_time: float | None = None  # its last report's time
    # The final attempt's last progress per rank: unix time (the harness's heartbeat) and
    # log offset (of the last metric read from the log).
    rank_times: Mapping[int, float] = field(default_factory=dict)
    rank_offsets: Mapping[int, int] = field(default_factory=dict)
    # The highest finite value each validation metric reached, any rank, every attempt
    # (how far a run counted by a time metric got: `searcher.time_metric`).
    validation_highest: Mapping[str, float] = field(default_factory=dict)
    # A few distinct steps reported, any kind, every attempt (`metrics_lines.few_steps`):
    # whether the run reported a series of steps or only one or two.
    steps: frozenset[int] = frozenset()


@dataclass(frozen=True)
class WarmStartFrom:
    """The checkpoint a warm-started trial began from (its experiment's `searcher.source_*`),
    as the experiment recorded it at submission."""

    step: int
    shown: str  # "checkpoint step-40-… of trial 3"
    # What the source trial trained to that checkpoint, where its verdict counted it and the
    # checkpoint is its last (`SourceEpochs`); None when unknown: this trial's epochs then
    # count as its own alone.
    epochs: SourceEpochs | None = None


@dataclass(frozen=True)
class SourceEpochs:
    """A finished trial's whole epochs as its `completed` check counted them (`whole`, its
    source's included) and the highest one's number (`last`): what a trial warm-started
    from its last checkpoint goes on from (a PBT member's parent)."""

    whole: int
    last: int

    def to_json(self) -> dict[str, int]:
        return {"whole": self.whole, "last": self.last}

    @classmethod
    def from_json(cls, raw: Any) -> SourceEpochs | None:
        """The verdict's `epochs`, or None where it has none (a verdict from before it was
        kept, a run counted in steps) or it is malformed."""
        if not isinstance(raw, dict):
            return None
        whole, last = raw.get("whole"), raw.get("last")
        if type(whole) is not int or type(last) is not int or whole < 1:
            return None
        return cls(whole, last)


@dataclass(frozen=True)
class Planned:
    """How far the run was planned to train, and who said so."""

    unit: str  # "steps", "epochs", "batches" or "records"; a time metric's name
    length: int
    # e.g. "verify.expected_length", "searcher.max_length", "ctx.plan()", "the lightning
    # integration"
    source: str
    # Steps are validation's where the run reports validation (the searcher's max_length
    # counts report_validation's steps); else training's, the steps a loop counts.
    validation_steps: bool = False
    # A validation metric whose value counts the progress (`searcher.time_metric`), or None.
    metric: str | None = None


@dataclass(frozen=True)
class LogLoss:
    """One rank's log of the final attempt: the output it lost (`lost_bytes`, every
    incarnation's, and `error`, why) and the output dropped to hold it to `limit`."""

    rank: int
    lost_bytes: int = 0
    error: str | None = None
    dropped_bytes: int = 0
    limit: int | None = None


@dataclass(frozen=True)
class LogCounts:
    """Samples per epoch counted from the rank logs (`verify.samples_from_log`)."""

    by_epoch: dict[int, int] = field(default_factory=dict)
    matches: int = 0
    unusable: int = 0
    problems: tuple[str, ...] = ()  # e.g. "attempt 1, rank 0: counting took longer than 60 s"


@dataclass(frozen=True)
class Evidence:
    """What the run directory says about a trial, read once, for `verify` to judge.

    `samples_by_epoch` holds, per epoch, the sum over ranks of the last attempt that
    reported that epoch (an epoch redone after a restart counts once). Metrics are kept as
    a summary: every name reported, the first non-finite values of each file and their
    total count.
    """

    samples_by_epoch: dict[int, int] = field(default_factory=dict)
    unreadable_samples_files: tuple[str, ...] = ()
    metric_names: frozenset[str] = frozenset()
    metric_lines: int = 0
    non_finite: tuple[MetricPoint, ...] = ()
    non_finite_count: int = 0
    unreadable_metric_lines: int = 0
    first_unreadable_metric_line: str | None = None  # its file (in the run dir) and line
    checkpoints: tuple[CheckpointInfo, ...] = ()
    harness_used: bool = False
    final_attempt: int | None = None
    checked_in: frozenset[int] = frozenset()  # ranks of the final attempt that checked in
    log_counts: LogCounts = field(default_factory=LogCounts)
    outputs: tuple[OutputFile, ...] = ()
    started_at: float | None = None  # when the trial's first attempt started
    # What each rank of the final attempt was made of (`muster.diagnostics`), by rank.
    rank_snapshots: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    # What each rank of the final attempt recorded of its data and gradients, by rank.
    rank_diagnostics: Mapping[int, bias.RankRecords] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    plan: Planned | None = None  # what the harness's ctx.plan() declared
    save_failures: tuple[SaveFailure, ...] = ()  # the final attempt's
    save_failure_count: int = 0
    # Steps and times of every checkpoint the trial is known to have saved (GC may have
    # deleted some): how often the script saves.
    saves: tuple[tuple[int, int | None, float | None], ...] = ()  # (step, attempt, time)
    # Epochs each attempt reported samples for (the harness's ctx.samples.seen).
    epochs_by_attempt: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    # The final attempt's rank logs, scanned for tracebacks (`log_errors`); None: not scanned.
    log_scans: tuple[RankScan, ...] | None = None
    # Metrics read from the rank logs (`verify.metrics_from_log`, the recognisers); their
    # names are in `metric_names` and their steps in `progress` too.
    log_metrics: LogMetricEvidence = field(default_factory=LogMetricEvidence)
    primary_ended_at: float | None = None  # when rank 0 of the final attempt exited
    # What each rank's log of the final attempt lost (a full disk) or dropped (its
    # log_limit); None: not gathered (`log_complete` does not run).
    log_losses: tuple[LogLoss, ...] | None = None
    warm_start: WarmStartFrom | None = None  # the checkpoint the trial began from


@dataclass(frozen=True)
class Check:
    """One check's finding: `status` is passed, failed, warning (it found something, and
    the config says to warn) or not_run (nothing to check: `detail` says why). Only a
    failed check fails the verdict; only a passed one is evidence."""

    name: str
    passed: bool
    detail: str
    status: CheckStatus | None = None  # derived from `passed` when not given

    def __post_init__(self) -> None:
        status = self.status or (CheckStatus.PASSED if self.passed else CheckStatus.FAILED)
        if status not in tuple(CheckStatus) or (status == CheckStatus.FAILED) == self.passed:
            raise ValueError(f"check {self.name}: status {status!r} with passed={self.passed}")
        object.__setattr__(self, "status", CheckStatus(status))

    @classmethod
    def warning(cls, name: str, detail: str) -> Check:
        return cls(name, True, f"warning: {detail}", CheckStatus.WARNING)

    @classmethod
    def not_run(cls, name: str, why: str) -> Check:
        return cls(name, True, f"not run: {why}", CheckStatus.NOT_RUN)


# The checks that look at what the run produced. An exit 0 is *verified* only when every
# check passed or warned, `completed` passed (it reached its planned end), and at least one
# of these passed as well; a check that did not run is never evidence.
RESULT_CHECKS = frozenset({"samples", "checkpoint", "require_metrics", "outputs",
                           "samples_from_log", "checkpoint_fresh", "outputs_fresh",
                           "resume_accounting"})


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: list[Check]
    # The whole epochs `completed` counted, where the run counted epochs: what a trial that
    # starts from this one's last checkpoint goes on from.
    epochs: SourceEpochs | None = None

    @property
    def verified(self) -> bool:
        """No check failed, the run reached its planned end, and a check of its results
        passed."""
        passed = {c.name for c in self.checks if c.status is CheckStatus.PASSED}
        return self.passed and "completed" in passed and bool(passed & RESULT_CHECKS)

    def why_not_verified(self) -> str:
        """Why a passing verdict is not verified, in words (empty when it is): the planned
        end first, then the missing evidence of results (as `muster.verdicts` shows it)."""
        if self.verified or not self.passed:
            return ""
        reasons = [f"{c.name}: {_without_not_run(c.detail)}" for c in self.checks
                   if c.name == "completed" and c.status is not CheckStatus.PASSED]
        if not any(c.status is CheckStatus.PASSED and c.name in RESULT_CHECKS
                   for c in self.checks):
            reasons.append("no check inspected its results (a checkpoint, outputs, samples "
                           "or required metrics)")
        reasons += [f"{c.name}: {_without_not_run(c.detail)}" for c in self.checks
                    if c.status is CheckStatus.NOT_RUN and c.name != "completed"
                    and c.name in RESULT_CHECKS]
        return "; ".join(reasons)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "verified": self.verified,
            "why_not_verified": self.why_not_verified() or None,
            "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail,
                        "status": c.status} for c in self.checks],
            **({"epochs": self.epochs.to_json()} if self.epochs is not None else {}),
        }


def _without_not_run(detail: str) -> str:
    return detail.removeprefix("not run: ")


# --- the decision -------------------------------------------------------------------------


def verify(
    evidence: Evidence, config: VerifyConfig, manifest_file_count: int | None,
    harness_ranks: int | None = None, diagnostics: DiagnosticsConfig | None = None,
    *, searcher_length: Planned | None = None, early_stopped: bool = False,
) -> Verdict:
    """Judge `evidence`; the verdict passes only if no check that applies failed.

    `harness_ranks` is the world size when the config declares `harness: true` (every rank
    of the final attempt must then have checked in), None when it does not. `diagnostics`
    says how the coded-bias checks judge (`diagnostics.*`; the defaults when None).
    `searcher_length` is the searcher's max_length, a planned end when nothing closer to
    the run declares one; `early_stopped`: the searcher stopped the trial (a planned end).
    """
    expected = (config.expected_samples if config.expected_samples is not None
                else manifest_file_count)
    harness = evidence.harness_used or harness_ranks is not None
    require_checkpoint = (harness if config.require_checkpoint is None
                          else config.require_checkpoint)
    checks = [
        _check_completed(evidence, planned_length(config, evidence.plan, searcher_length),
                         early_stopped, expected, config.samples_tolerance),
        _check_check_ins(evidence, harness_ranks) if harness_ranks is not None else None,
        _check_samples(evidence, expected, config.samples_tolerance)
        if expected is not None and (config.samples_from_log is None or evidence.harness_used)
        else None,
        _check_resume_accounting(evidence.epochs_by_attempt)
        if len(evidence.epochs_by_attempt) > 1 else None,
        _check_checkpoint(evidence.checkpoints) if require_checkpoint else None,
        _check_checkpoint_fresh(evidence)
        if require_checkpoint or evidence.save_failure_count else None,
        _check_finite_metrics(evidence) if config.finite_metrics else None,
        _check_required_metrics(evidence.metric_names, config.require_metrics)
        if config.require_metrics else None,
        _check_log_samples(evidence.log_counts, expected, config.samples_tolerance)
        if config.samples_from_log is not None and expected is not None else None,
        _check_outputs(evidence.outputs, evidence.started_at) if config.outputs else None,
        _check_outputs_fresh(evidence.outputs, evidence.final_attempt)
        if config.outputs else None,
        _check_log_errors(evidence.log_scans, evidence.progress, config.log_errors,
                          evidence.primary_ended_at)
        if evidence.log_scans is not None and config.log_errors != "off" else None,
        _check_log_complete(evidence.log_losses) if evidence.log_losses is not None else None,
        _check_metrics_readable(evidence),
        _check_consistent_ranks(evidence.rank_snapshots, config.consistent_ranks)
        if config.consistent_ranks != "off" and len(evidence.rank_snapshots) > 1 else None,
    ]
    kept = [c for c in checks if c is not None]
    kept += _diagnostics_checks(evidence, diagnostics or DiagnosticsConfig())
    return Verdict(passed=all(c.passed for c in kept), checks=kept,
                   epochs=_epochs_counted(evidence, config.samples_tolerance))


def planned_length(config: VerifyConfig, plan: Planned | None,
                   searcher: Planned | None) -> Planned | None:
    """The planned length closest to the run: the config's own (`verify.expected_length`),
    the script's (`plan`: its ctx.plan(), `read_plan`), the searcher's (`searcher_length`).
    The `completed` check judges a run's end by it, and a running trial's progress is
    measured against it (`muster.services.progress`)."""
    if config.expected_length is not None:
        return Planned(config.expected_length.unit, config.expected_length.length,
                       "verify.expected_length")
    return plan or searcher


def searcher_length(searcher: SearcherConfig, length: int | None = None) -> Planned | None:
    """The searcher's max_length as a planned length (it counts validation's steps, or the
    value of its time metric); `length`, the trial's own where the searcher gives each
    trial one (a PBT member: `SearcherConfig.length_of`)."""
    by_round = searcher.name == "pbt" and length is not None
    source = "searcher.length_per_round" if by_round else "searcher.max_length"
    length = searcher.max_length if length is None else length
    if length is None:
        return None
    if searcher.time_metric is not None:
        return Planned(searcher.time_metric, length, source,
                       validation_steps=True, metric=searcher.time_metric)
    return Planned(searcher.max_length_unit, length, source, validation_steps=True)


# --- completion ---------------------------------------------------------------------------

_UNIT_NOUN = {"steps": "step", "batches": "batch", "epochs": "epoch", "records": "record"}


def _check_completed(evidence: Evidence, planned: Planned | None, early_stopped: bool,
                     expected: int | None = None, tolerance: float = 0.01) -> Check:
    """The last reported progress reached the planned length (or the searcher stopped the
    trial early, which is a planned end)."""
    if early_stopped:
        return Check("completed", True, "stopped early by the searcher (a planned end)")
    if planned is None:
        return Check.not_run("completed", "no planned length (set verify.expected_length or "
                                          "searcher.max_length, or call ctx.plan() in the "
                                          "script)")
    done = (_counted_by(evidence, planned.metric) if planned.metric is not None else
            _progress_in(evidence, planned.unit, expected, tolerance, planned.validation_steps))
    noun = _UNIT_NOUN.get(planned.unit, planned.unit)
    plan = f"{planned.length:,} {planned.unit} planned ({planned.source})"
    if done is None:
        return Check("completed", False, f"no progress in {planned.unit} was reported; {plan}")
    if done >= planned.length:
        untrained = _no_steps_of_its_own(evidence, planned)
        if untrained is not None:
            return Check("completed", False, untrained)
        return Check("completed", True, f"reached {noun} {done:,} of {planned.length:,} "
                                        f"({planned.source})")
    percent = math.floor(done / planned.length * 100)
    return Check("completed", False, f"stopped at {noun} {done:,} of {planned.length:,} "
                                     f"({percent}%; {planned.source})")


def _no_steps_of_its_own(evidence: Evidence, planned: Planned) -> str | None:
    """Why a warm-started trial that reached its planned end shows no training of its own,
    or None when it does (or was not warm-started).

    A script may restore the source's step counter with its weights (Lightning, the Hugging
    Face Trainer, a loop that starts at `restore().step`): when its planned length does not
    pass the source's step, it trains nothing, yet a report at that step (a `validate()`
    after `fit`, the trainer's summary) reaches the plan. Its own training shows as a step
    past the source's, a series of steps besides the source's (a run that counts from 0),
    or samples it counted. Epochs and records are counted from the trial's own samples.
    """
    start = evidence.warm_start
    if start is None or start.step <= 0 or planned.unit in ("epochs", "records"):
        return None
    progress = evidence.progress
    if any(step > start.step for step in progress.highest.values()):
        return None
    if len(progress.steps - {start.step}) >= 2:
        return None
    if evidence.samples_by_epoch or evidence.log_counts.by_epoch:
        return None
    reported = " and ".join(f"{step:,}" for step in sorted(progress.steps))
    return (f"the trial started from the warm start's {start.shown} at step {start.step:,} "
            f"and reported step {reported} only, nothing past it: nothing shows it trained "
            f"a step of its own. A script that restores the source's step counter "
            f"(Lightning, the Hugging Face Trainer, a loop from restore().step) trains "
            f"nothing when its plan ({planned.length:,} {planned.unit}; {planned.source}) "
            f"does not pass step {start.step:,}: plan past it, or count from 0 when "
            f"restore().warm_start is true")


def _counted_by(evidence: Evidence, metric: str) -> int | None:
    """How far a run counted by a time metric got: the whole part of the highest value of
    `metric` it reported with its validation."""
    highest = evidence.progress.validation_highest.get(metric)
    return None if highest is None else int(highest)


def _progress_in(evidence: Evidence, unit: str, expected: int | None,
                 tolerance: float, validation_steps: bool = False) -> int | None:
    """How much of `unit` the run reported doing: steps counted from 1 (a run that
    numbers from 0 has done its highest step + 1); records and whole epochs from the
    sample counts (the harness's, else the log's). An epoch is whole when it saw as many
    samples as the run's fullest epoch (within the tolerance): an epoch cut short by a
    crash is not done."""
    if unit in ("epochs", "records"):
        by_epoch = evidence.samples_by_epoch or evidence.log_counts.by_epoch
        if not by_epoch:
            return None
        if unit == "records":
            return sum(by_epoch.values())
        counted = _epochs_done(by_epoch, tolerance, evidence.warm_start)
        return None if counted is None else counted.whole
    progress = evidence.progress
    for kind in step_kinds(validation_steps):
        if kind in progress.highest:
            return steps_done(progress.highest[kind], progress.lowest.get(kind))
    return None


def step_kinds(validation_steps: bool) -> tuple[MetricKind, MetricKind]:
    """The report kinds whose steps count a plan's steps, the one that counts first."""
    kinds = (MetricKind.VALIDATION, MetricKind.TRAINING)
    return kinds if validation_steps else kinds[::-1]


def steps_done(highest: int, lowest: int | None) -> int:
    """Steps done, counted from 1: a run that numbers from 0 has done its highest + 1."""
    return highest + (1 if lowest == 0 else 0)


def whole_epochs(by_epoch: Mapping[int, int], tolerance: float) -> int:
    """The epochs that are whole next to the run's own fullest epoch (within `tolerance`):
    an epoch cut short by a crash is not done, while a run that drops samples in every
    epoch is the samples check's to fail, not `completed`'s."""
    whole = max(by_epoch.values(), default=0)
    return sum(1 for seen in by_epoch.values() if seen >= whole * (1 - tolerance))


def _epochs_done(by_epoch: Mapping[int, int], tolerance: float,
                        source: WarmStartFrom | None) -> SourceEpochs | None:
    """The run's whole epochs (`whole_epochs`) and the highest one's number; for a run
    warm-started from a trial's last checkpoint that goes on numbering its epochs from that
    trial's (a PBT member, a fine-tune that keeps the epoch counter), the source's whole
    epochs as well, when this run's whole epochs follow the source's last without a gap.
    Epochs numbered from anywhere else are this run's alone: a script that starts at epoch
    9 has trained the epochs it shows, not 8 more."""
    whole = max(by_epoch.values(), default=0)
    numbers = sorted(e for e, seen in by_epoch.items() if seen >= whole * (1 - tolerance))
    if not numbers:
        return None
    before = source.epochs if source is not None else None
    if (before is not None and numbers[0] == before.last + 1
            and numbers == list(range(numbers[0], numbers[-1] + 1))):
        return SourceEpochs(before.whole + len(numbers), numbers[-1])
    return SourceEpochs(len(numbers), numbers[-1])


def _epochs_counted(evidence: Evidence, tolerance: float) -> SourceEpochs | None:
    """The whole epochs the run counted (the harness's samples, else the log's), for the
    verdict to keep: None when it counted none."""
    by_epoch = evidence.samples_by_epoch or evidence.log_counts.by_epoch
    return _epochs_done(by_epoch, tolerance, evidence.warm_start) if by_epoch else None


def _check_resume_accounting(epochs_by_attempt: Mapping[int, tuple[int, ...]]) -> Check:
    """Across attempts, every epoch from the first to the last was trained by some attempt:
    a resume that skips epochs (the checkpoint said epoch 3, the next attempt started at
    epoch 5) leaves them untrained. An epoch redone by a later attempt counts once."""
    seen = sorted({e for epochs in epochs_by_attempt.values() for e in epochs})
    skipped = [e for e in range(seen[0], seen[-1] + 1) if e not in set(seen)] if seen else []
    attempts = count(len(epochs_by_attempt), "attempt")
    if not skipped:
        return Check("resume_accounting", True,
                     f"{attempts}: every epoch from {seen[0]} to {seen[-1]} was trained"
                     if seen else f"{attempts}: no epochs reported")
    problems = []
    for epoch in skipped[:SHOWN_NON_FINITE]:
        before = max(((a, max(e for e in es if e < epoch)) for a, es in
                      epochs_by_attempt.items() if any(e < epoch for e in es)),
                     key=lambda pair: pair[1], default=None)
        after = min(((a, min(e for e in es if e > epoch)) for a, es in
                     epochs_by_attempt.items() if any(e > epoch for e in es)),
                    key=lambda pair: pair[1], default=None)
        where = ""
        if before is not None and after is not None:
            where = (f" (attempt {before[0]} reported up to epoch {before[1]}, attempt "
                     f"{after[0]} went on from epoch {after[1]})")
        problems.append(f"epoch {epoch} was never trained{where}")
    more = len(skipped) - len(problems)
    return Check("resume_accounting", False, "; ".join(problems)
                 + (f"; and {count(more, 'more epoch')}" if more > 0 else ""))


def _check_checkpoint_fresh(evidence: Evidence) -> Check | None:
    """The attempt that ended saved the checkpoint that holds its training: one of its own
    at or after its last reported step, within the script's own saving period (measured
    from its saves); and no save it made failed without a later one succeeding."""
    final = evidence.final_attempt
    intact = [c for c in evidence.checkpoints if c.intact]
    unsaved = [f for f in evidence.save_failures if not any(
        c.attempt == final and c.step >= f.step and (c.saved_at or 0.0) > f.time
        for c in intact)]
    if unsaved:
        shown = "; ".join(f"the save of step {f.step:,} (rank {f.rank}) failed: {f.error}"
                          for f in unsaved[:3])
        return Check("checkpoint_fresh", False, f"{shown}; no later save succeeded, so the "
                                                "training after it was not kept")
    if not intact:
        return None  # `checkpoint` says there is none
    latest = max(intact, key=lambda c: (c.step, c.saved_at or 0.0))
    saves = evidence.saves or tuple((c.step, c.attempt, c.saved_at) for c in intact)
    steps_period, time_period = _saving_period(saves, final)
    last_step = evidence.progress.final_attempt_step
    if last_step is None:
        overall = max(evidence.progress.highest.values(), default=None)
        if overall is None or latest.step >= overall - steps_period:
            return Check("checkpoint_fresh", True,
                         f"attempt {final} reported no progress; the latest checkpoint "
                         f"({latest.name}) holds the training reported before it")
        return Check("checkpoint_fresh", False,
                     f"the latest checkpoint is step {latest.step:,}, but the run reported "
                     f"step {overall:,}")
    own = [c for c in intact if c.attempt == final]
    if not own:
        return Check("checkpoint_fresh", False,
                     f"attempt {final} saved no checkpoint, though it trained to step "
                     f"{last_step:,}; the latest ({latest.name}) is from attempt "
                     f"{latest.attempt if latest.attempt is not None else '?'}")
    mine = max(own, key=lambda c: (c.step, c.saved_at or 0.0))
    last_time = evidence.progress.final_attempt_time
    by_step = mine.step >= last_step - steps_period
    by_time = (mine.saved_at is not None and last_time is not None
               and mine.saved_at >= last_time - time_period)
    if by_step or by_time:
        return Check("checkpoint_fresh", True,
                     f"attempt {final} saved step {mine.step:,} ({mine.name}); it reported "
                     f"up to step {last_step:,}")
    return Check("checkpoint_fresh", False,
                 f"attempt {final}'s latest checkpoint is step {mine.step:,}, but it went on "
                 f"to step {last_step:,}"
                 + (f" (it saves every {steps_period:,} steps)" if steps_period else "")
                 + ": its last training was not saved")


def _saving_period(saves: Sequence[tuple[int, int | None, float | None]],
                   final: int | None) -> tuple[int, float]:
    """How often the script saves, in steps and seconds: the largest gap between two
    consecutive saves of the final attempt (of any attempt, if it saved fewer than two);
    (0, 0.0) with fewer than two saves."""
    own = [s for s in saves if s[1] == final]
    chosen = sorted(own if len(own) >= 2 else saves)
    if len(chosen) < 2:
        return 0, 0.0
    steps = max(b[0] - a[0] for a, b in itertools.pairwise(chosen))
    times = sorted(t for _, _, t in chosen if t is not None)
    seconds = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    return max(steps, 0), seconds


def _check_outputs_fresh(outputs: Sequence[OutputFile], final: int | None) -> Check:
    """Each output was created or changed by the attempt that ended: a file an earlier
    (killed) attempt wrote, left as it was, is not this attempt's result."""
    if any(o.unchanged is None for o in outputs if o.size):
        return Check.not_run("outputs_fresh", f"no record of the outputs as attempt {final} "
                                              "started")
    stale = [o.path for o in outputs if o.size and o.unchanged]
    if stale:
        return Check("outputs_fresh", False,
                     f"{', '.join(stale)}: not written by attempt {final}, the one that "
                     "ended (it is the file an earlier attempt left)")
    written = [o.path for o in outputs if o.size]
    return Check("outputs_fresh", True, f"{count(len(written), 'file')} written by attempt "
                                        f"{final}" + (f": {', '.join(written)}" if written else ""))


def _check_log_errors(scans: Sequence[RankScan], progress: Progress, mode: str,
                      primary_ended_at: float | None = None) -> Check:
    """No rank's log shows a traceback, KeyboardInterrupt or CUDA/NCCL error after its last
    reported progress; one the script printed and went on from is a warning, and so is a
    peer's after the primary had exited 0 (its teardown: the primary has the last word)."""
    problems = [f"rank {scan.rank}: {scan.problem}" for scan in scans if scan.problem]
    after: list[str] = []
    before: list[str] = []
    for scan in scans:
        for finding in scan.findings:
            shown = (f"rank {scan.rank}, log offset {finding.offset:,}: {finding.text}")
            if scan.rank != 0 and primary_ended_at is not None and finding.time is not None \
                    and finding.time > primary_ended_at:
                before.append(f"{shown} (after rank 0 had exited 0)")
                continue
            (after if _after_progress(finding, scan.rank, progress) else before).append(shown)
    if after:
        detail = (f"the log ends in an error after the last progress: {after[-1]}"
                  + (f" (and {count(len(after) - 1, 'more')})" if len(after) > 1 else ""))
        if mode == "warn":
            return Check.warning("log_errors", detail)
        return Check("log_errors", False, f"{detail}; verify.log_errors: warn only warns")
    if problems:
        return Check.not_run("log_errors", "; ".join(problems))
    if before:
        return Check.warning("log_errors", f"an error the run went on from: {before[-1]}"
                             + (f" (and {count(len(before) - 1, 'more')})"
                                if len(before) > 1 else ""))
    return Check("log_errors", True, f"no traceback, KeyboardInterrupt or CUDA/NCCL error in "
                                     f"{count(len(scans), 'rank log')}")


def _after_progress(finding: Finding, rank: int, progress: Progress) -> bool:
    """The finding comes after the rank's last progress (or no progress is known)."""
    offset = progress.rank_offsets.get(rank)
    if offset is not None and finding.offset <= offset:
        return False
    when = progress.rank_times.get(rank)
    return not (when is not None and finding.time is not None and finding.time <= when)


def _diagnostics_checks(evidence: Evidence, config: DiagnosticsConfig) -> list[Check]:
    """The coded-bias checks (`muster.diagnostics.bias`) as `diagnostics.<name>`, each
    judged as its mode says: SUSPECT, a warning in its detail, or not at all."""
    if not evidence.rank_diagnostics:
        return []
    findings = bias.judge(evidence.rank_diagnostics, bias.Bounds.of(config),
                          _reported_non_finite(evidence, set(evidence.rank_diagnostics)))
    checks = []
    for finding in findings:
        mode = getattr(config, finding.check)
        name = f"diagnostics.{finding.check}"
        if mode == "off":
            continue
        if not finding.found:
            checks.append(Check(name, True, finding.detail))
        elif mode == "warn":
            checks.append(Check.warning(name, finding.detail))
        else:
            checks.append(Check(name, False, finding.detail))
    return checks


def _reported_non_finite(evidence: Evidence, ranks: set[int]) -> dict[int, str]:
    """The first non-finite metric each rank of the final attempt reported."""
    first: dict[int, str] = {}
    for point in sorted(evidence.non_finite, key=lambda p: (p.step, p.rank, p.name)):
        if point.attempt == evidence.final_attempt and point.rank in ranks:
            first.setdefault(point.rank, f"reported {_non_finite_text(point)}")
    return first


def rank_differences(snapshots: Mapping[int, Mapping[str, Any]]) -> str | None:
    """What the ranks of one attempt ran on differently (libraries, frameworks, numerics
    switches and variables; not their seeds: a per-rank seed is often right), in words;
    None when they are alike."""
    differences = [d for d in diff.diff_ranks(snapshots)
                   if diff.result_relevant(d) and not d.field.startswith("seed.")]
    if not differences:
        return None
    shown = "; ".join(d.line() for d in differences[:SHOWN_DIFFERENCES])
    more = len(differences) - SHOWN_DIFFERENCES
    return (f"{count(len(snapshots), 'rank')} differ in what they ran on (the reference is "
            f"the lowest rank): {shown}" + (f"; and {more} more" if more > 0 else ""))


def _check_consistent_ranks(snapshots: Mapping[int, Mapping[str, Any]], mode: str) -> Check:
    """The ranks of the final attempt ran on the same libraries, frameworks, numerics
    switches and variables."""
    detail = rank_differences(snapshots)
    if detail is None:
        return Check("consistent_ranks", True, f"{count(len(snapshots), 'rank')}: the same "
                                               "libraries, frameworks, numerics switches and "
                                               "variables")
    if mode == "warn":
        return Check.warning("consistent_ranks", detail)
    return Check("consistent_ranks", False, f"{detail}; `muster trial diff` compares trials, "
                 "verify.consistent_ranks: warn only warns")


def _check_samples(evidence: Evidence, expected: int, tolerance: float) -> Check:
    """Samples seen in each epoch, summed over ranks, against the expected count."""
    if evidence.unreadable_samples_files:
        files = ", ".join(evidence.unreadable_samples_files)
        return Check("samples", False, f"unreadable sample counts in {files}")
    if expected == 0:
        return Check("samples", False, EMPTY_DATA)
    if not evidence.samples_by_epoch:
        return Check("samples", False, "no samples were reported (ctx.samples.seen); "
                                       f"expected {expected:,} per epoch")
    failing = _shortfalls(evidence.samples_by_epoch, expected, tolerance)
    if failing:
        return Check("samples", False, "; ".join(failing))
    epochs = count(len(evidence.samples_by_epoch), "epoch")
    return Check("samples", True,
                 f"{epochs}, each within {_tolerance_text(tolerance)} of {expected:,}")


def _shortfalls(by_epoch: Mapping[int, int], expected: int, tolerance: float) -> list[str]:
    """What each epoch whose count is off by more than the tolerance says, in order."""
    return [_epoch_shortfall(epoch, seen, expected) for epoch, seen in sorted(by_epoch.items())
            if abs(seen - expected) > tolerance * expected]


def _check_log_samples(counts: LogCounts, expected: int, tolerance: float) -> Check:
    """Samples counted from the logs in each epoch, summed over ranks, against the expected
    count (as `_check_samples` does with the harness's counts)."""
    if counts.problems:
        return Check("samples_from_log", False, "; ".join(counts.problems))
    if expected == 0:
        return Check("samples_from_log", False, EMPTY_DATA)
    if not counts.by_epoch:
        unusable = (f" ({count(counts.unusable, 'match', 'matches')} without whole numbers in its "
                    "groups)"
                    if counts.unusable else "")
        return Check("samples_from_log", False, "no log line matched "
                     f"verify.samples_from_log{unusable}; expected {expected:,} per epoch")
    failing = _shortfalls(counts.by_epoch, expected, tolerance)
    if failing:
        return Check("samples_from_log", False, "; ".join(failing))
    return Check("samples_from_log", True,
                 f"{count(len(counts.by_epoch), 'epoch')} in the logs, each within "
                 f"{_tolerance_text(tolerance)} of {expected:,}")


def _check_outputs(outputs: Sequence[OutputFile], started_at: float | None) -> Check:
    """Each file the config names exists, is not empty, and was written during the run."""
    problems = []
    for output in outputs:
        if output.size is None:
            problems.append(f"{output.path} is missing")
        elif output.size == 0:
            problems.append(f"{output.path} is empty")
        elif started_at is not None and (output.modified_at or 0.0) < started_at:
            problems.append(f"{output.path} was not written during the run (it is older "
                            "than the trial's first attempt)")
    if problems:
        return Check("outputs", False, "; ".join(problems))
    return Check("outputs", True, f"{count(len(outputs), 'file')} written: "
                                  + ", ".join(o.path for o in outputs))


def _check_check_ins(evidence: Evidence, world_size: int) -> Check:
    """With `harness: true`, every rank of the attempt that finished called init(): one
    that did not reported no samples, metrics or checkpoints, whatever it trained."""
    missing = [rank for rank in range(world_size) if rank not in evidence.checked_in]
    if not missing:
        return Check("check_in", True, f"{'the' if world_size == 1 else 'all'} "
                                       f"{count(world_size, 'rank')} checked in through "
                                       "muster.harness.init()")
    return Check("check_in", False,
                 f"{rank_list(missing)} of attempt {evidence.final_attempt} never checked in "
                 "through muster.harness.init(), although the config sets `harness: true`")


def _check_checkpoint(checkpoints: Sequence[CheckpointInfo]) -> Check:
    """At least one intact checkpoint; the corrupt ones are named either way."""
    intact = [c for c in checkpoints if c.intact]
    problems = "; ".join(f"{c.name}: {c.problem}" for c in checkpoints if not c.intact)
    if not checkpoints:
        return Check("checkpoint", False, "no checkpoint was saved (checkpoints/ is empty)")
    if not intact:
        return Check("checkpoint", False, f"no intact checkpoint: {problems}")
    latest = intact[-1]  # they come best last
    detail = f"{len(intact)} intact, latest {latest.name}"
    return Check("checkpoint", True, f"{detail}; {problems}" if problems else detail)


def _check_finite_metrics(evidence: Evidence) -> Check:
    from_log = evidence.log_metrics.describe()
    if from_log is not None:
        return Check("finite_metrics", False, from_log + " (read from the log)")
    if evidence.non_finite_count == 0:
        if not evidence.metric_names:
            return Check.not_run("finite_metrics", "no metric reported")
        return Check("finite_metrics", True, "no NaN or infinite value "
                                             f"({count(len(evidence.metric_names), 'metric')})")
    shown = sorted(evidence.non_finite, key=lambda p: (p.attempt, p.step, p.rank, p.name))
    parts = [_non_finite_text(p) for p in shown[:SHOWN_NON_FINITE]]
    rest = evidence.non_finite_count - len(parts)
    if rest > 0:
        parts.append(f"and {count(rest, 'more non-finite value')}")
    return Check("finite_metrics", False, "; ".join(parts))


def _check_required_metrics(reported: frozenset[str], required: Sequence[str]) -> Check:
    missing = [name for name in required if name not in reported]
    if missing:
        return Check("require_metrics", False,
                     "; ".join(f"{name} was never reported" for name in missing))
    return Check("require_metrics", True, f"reported: {', '.join(required)}")


def _check_log_complete(losses: Sequence[LogLoss]) -> Check:
    """Every byte each rank printed reached its log: a log that lost output (a full disk)
    is incomplete evidence, and fails; output dropped by `resources.log_limit` was dropped
    on purpose (the head and the latest output are kept), a warning."""
    lost = [loss for loss in losses if loss.lost_bytes or loss.error]
    if lost:
        return Check("log_complete", False, "; ".join(map(_lost_text, lost)))
    capped = [loss for loss in losses if loss.dropped_bytes]
    if capped:
        return Check.warning("log_complete", "; ".join(
            f"rank {loss.rank}'s log reached resources.log_limit"
            f"{f' ({format_size(loss.limit)})' if loss.limit else ''}: "
            f"{format_size(loss.dropped_bytes)} of output from its middle were dropped, as "
            "the limit asks (its head and its latest output are kept)" for loss in capped))
    return Check("log_complete", True, f"every byte of output reached the log "
                                       f"({count(len(losses), 'rank')})")


def _lost_text(loss: LogLoss) -> str:
    if not loss.lost_bytes:
        return f"rank {loss.rank}'s log is incomplete: {loss.error}"
    why = f" ({loss.error})" if loss.error else ""
    return (f"rank {loss.rank} lost {format_size(loss.lost_bytes)} of output{why}: the log "
            "is incomplete")


def _check_metrics_readable(evidence: Evidence) -> Check:
    bad = evidence.unreadable_metric_lines
    if bad:
        return Check("metrics_readable", False,
                     f"{count(bad, 'unreadable metric line')} "
                     f"(the first at {evidence.first_unreadable_metric_line})")
    if not evidence.metric_lines:
        return Check.not_run("metrics_readable", "no metric line was written")
    return Check("metrics_readable", True,
                 f"{count(evidence.metric_lines, 'metric line')} read")



def _epoch_shortfall(epoch: int, seen: int, expected: int) -> str:
    text = f"epoch {epoch}: {seen:,} samples seen, {expected:,} expected"
    if expected <= 0:
        return text
    return f"{text} ({_signed_percent((seen - expected) / expected * 100)})"


def _signed_percent(percent: float) -> str:
    digits = 1 if abs(percent) >= 0.1 else 3  # a tight tolerance must not show "+0.0%"
    return f"{percent:+.{digits}f}%".replace("-", MINUS)


def _tolerance_text(tolerance: float) -> str:
    percent = tolerance * 100
    text = f"{percent:.1f}"
    return f"{text if float(text) == percent else f'{percent:g}'}%"


def _non_finite_text(point: MetricPoint) -> str:
    """E.g. "loss was NaN at step 120 (training)"; attempt and rank when not 1 and 0."""
    value = "NaN" if math.isnan(point.value) else ("Infinity" if point.value > 0
                                                   else "-Infinity")
    where = [point.kind]
    where += [f"attempt {point.attempt}"] if point.attempt != 1 else []
    where += [f"rank {point.rank}"] if point.rank != 0 else []
    return f"{point.name} was {value} at step {point.step} ({', '.join(where)})"


# --- the readers --------------------------------------------------------------------------


def gather_evidence(
    run_dir: Path, attempts: Sequence[int], *, log_counts: LogCounts | None = None,
    outputs: Sequence[str] = (), started_at: float | None = None,
    outputs_before: Mapping[str, Any] | None = None,
    saves: Sequence[tuple[int, int | None, float | None]] | None = None,
    log_scans: Sequence[RankScan] | None = None,
    log_metrics: LogMetricEvidence | None = None,
    primary_ended_at: float | None = None,
    log_lost: Mapping[int, int] | None = None,
    warm_start: WarmStartFrom | None = None,
) -> Evidence:
    """Read what the trial's attempts left in `run_dir` (all attempts, any order); with
    `outputs`, which of those files its working directory holds.

    `outputs_before`: the outputs as the final attempt found them when it started
    (`Attempt.outputs_before`); `saves`: every checkpoint the store knows of the trial,
    GC'd ones included, as (step, attempt, time); `log_scans`: the final attempt's logs,
    scanned (`muster.supervise.log_errors`); `log_metrics`: the metrics read from the
    rank logs of every attempt (`muster.supervise.log_metrics`); `log_lost`: the bytes each
    rank of the final attempt could not write to its log, every incarnation's (the store's);
    `warm_start`: the checkpoint the trial began from, for an experiment with a warm start.
    """
    from_log = log_metrics or LogMetricEvidence()
    ordered = sorted(attempts)
    final = ordered[-1] if ordered else None
    samples, unreadable_samples, epochs_by_attempt = read_samples(run_dir, ordered)
    metrics = _read_metrics(run_dir, ordered)
    heartbeats = {n: _rank_files(run_dir, n, RankFile.HEARTBEAT) for n in ordered}
    checkpoints = tuple(_read_checkpoints(RunDir(run_dir).checkpoints))
    failures, failure_count = _read_save_failures(run_dir, final)
    workdir = RunDir(run_dir).workdir
    return Evidence(
        samples_by_epoch=samples,
        unreadable_samples_files=unreadable_samples,
        metric_names=frozenset(metrics.names) | from_log.names,
        metric_lines=metrics.lines,
        non_finite=tuple(metrics.non_finite),
        non_finite_count=metrics.non_finite_count,
        unreadable_metric_lines=metrics.unreadable,
        first_unreadable_metric_line=metrics.first_unreadable,
        checkpoints=checkpoints,
        harness_used=any(heartbeats.values()),
        final_attempt=final,
        checked_in=frozenset(rank for rank, _ in heartbeats[final])
        if final is not None else frozenset(),
        log_counts=log_counts or LogCounts(),
        outputs=tuple(_output_file(workdir, path, outputs_before) for path in outputs),
        started_at=started_at,
        rank_snapshots=(read_rank_parts(RunDir(run_dir).attempt(final).path)
                        if final is not None else {}),
        rank_diagnostics=(read_rank_records(RunDir(run_dir).attempt(final).path)
                          if final is not None else {}),
        progress=_progress(metrics, from_log, _progress_times(run_dir, final)),
        plan=read_plan(run_dir, ordered),
        save_failures=failures,
        save_failure_count=failure_count,
        saves=tuple(saves) if saves is not None else tuple(
            (c.step, c.attempt, c.saved_at) for c in checkpoints if c.intact),
        epochs_by_attempt=epochs_by_attempt,
        log_scans=tuple(log_scans) if log_scans is not None else None,
        log_metrics=from_log,
        primary_ended_at=primary_ended_at,
        log_losses=(_log_losses(run_dir, final, log_lost)
                    if log_lost is not None and final is not None else None),
        warm_start=warm_start,
    )


def _log_losses(run_dir: Path, final: int, lost: Mapping[int, int]) -> tuple[LogLoss, ...]:
    """Each rank's loss: its bytes from the store, why from its exit record, and what its
    log_limit dropped from the log's record of dropped ranges."""
    losses = []
    for rank in sorted(lost):
        files = RunDir(run_dir).attempt(final).rank(rank)
        try:
            record = read_json(files.exit)
        except (OSError, ValueError):  # the store's count still speaks
            record = None
        error = record.get("log_lost_error") if isinstance(record, dict) else None
        drops = read_drops(files.dropped)[1]
        losses.append(LogLoss(rank, lost[rank], error if isinstance(error, str) else None,
                              drops.dropped if drops is not None else 0,
                              drops.limit if drops is not None else None))
    return tuple(losses)


def _progress(metrics: _MetricsSummary, from_log: LogMetricEvidence,
              rank_times: dict[int, float]) -> Progress:
    """How far the run got, by the harness's reports and the metrics read from its logs."""
    highest, lowest = dict(metrics.highest), dict(metrics.lowest)
    for kind, step in from_log.highest.items():
        highest[kind] = max(highest.get(kind, step), step)
    for kind, step in from_log.lowest.items():
        lowest[kind] = min(lowest.get(kind, step), step)
    steps = [s for s in (metrics.final_step, from_log.final_step) if s is not None]
    return Progress(highest=highest, lowest=lowest,
                    final_attempt_step=max(steps) if steps else None,
                    final_attempt_time=metrics.final_time, rank_times=rank_times,
                    rank_offsets=dict(from_log.last_offsets),
                    validation_highest=dict(metrics.validation_highest),
                    steps=metrics_lines.few_steps(metrics.steps, from_log.steps))


def combine_log_counts(per_attempt: Mapping[int, Mapping[int, LogSamples]]) -> LogCounts:
    """One trial's log counts (attempt -> rank -> counts): per epoch, the sum over ranks of
    the last attempt that reported that epoch (an epoch redone after a restart counts once),
    as for the harness's samples."""
    by_epoch: dict[int, int] = {}
    matches = unusable = 0
    problems = []
    for attempt, ranks in sorted(per_attempt.items()):
        in_attempt: dict[int, int] = {}
        for rank, counted in sorted(ranks.items()):
            if counted.problem is not None:
                problems.append(f"attempt {attempt}, rank {rank}: {counted.problem}")
            for epoch, samples in counted.by_epoch.items():
                in_attempt[epoch] = in_attempt.get(epoch, 0) + samples
            matches, unusable = matches + counted.matches, unusable + counted.unusable
        by_epoch.update(in_attempt)
    return LogCounts(dict(sorted(by_epoch.items())), matches, unusable, tuple(problems))


def _output_file(workdir: Path, relative: str,
                 before: Mapping[str, Any] | None = None) -> OutputFile:
    identity = output_identity(workdir, relative)
    if identity is None:
        return OutputFile(relative, None, None)
    unchanged = None if before is None else before.get(relative) == identity
    return OutputFile(relative, identity[1], identity[2] / 1e9, unchanged)


def output_identity(workdir: Path, relative: str) -> list[int] | None:
    """[inode, size, mtime_ns, ctime_ns] of the regular file at `relative` under `workdir`
    (not following a link in its place), or None when there is none: what
    `Attempt.outputs_before` records as an attempt starts. The change time is the kernel's:
    a script cannot set it back."""
    try:
        info = (workdir / relative).lstat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def outputs_as_found(workdir: Path, outputs: Sequence[str]) -> dict[str, list[int] | None]:
    """Each `verify.outputs` file's identity as it is now (`output_identity`)."""
    return {path: output_identity(workdir, path) for path in outputs}


def read_samples(
    run_dir: Path, attempts: Sequence[int]
) -> tuple[dict[int, int], tuple[str, ...], dict[int, tuple[int, ...]]]:
    """Samples per epoch, each epoch from the last attempt that reported it; bad files;
    the epochs each attempt reported."""
    by_epoch: dict[int, int] = {}
    unreadable: list[str] = []
    epochs_by_attempt: dict[int, tuple[int, ...]] = {}
    for attempt in attempts:
        in_attempt: dict[int, int] = {}
        for _, path in _rank_files(run_dir, attempt, RankFile.SAMPLES):
            epochs = _epoch_counts(path)
            if epochs is None:
                unreadable.append(_relative(path, run_dir))
                continue
            for epoch, seen in epochs.items():
                in_attempt[epoch] = in_attempt.get(epoch, 0) + seen
        by_epoch.update(in_attempt)  # a later attempt replaces the epochs it redid
        if in_attempt:
            epochs_by_attempt[attempt] = tuple(sorted(in_attempt))
    return dict(sorted(by_epoch.items())), tuple(unreadable), epochs_by_attempt


def _epoch_counts(path: Path) -> dict[int, int] | None:
    """{epoch: samples} from one rank's samples file; None when it is not that shape."""
    try:
        epochs = json.loads(read_regular(path))["epochs"]
        counts = {int(epoch): seen for epoch, seen in epochs.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(_is_int(seen) and seen >= 0 for seen in counts.values()):
        return None
    return counts


def read_plan(run_dir: Path, attempts: Sequence[int]) -> Planned | None:
    """What the latest attempt that called ctx.plan() declared (its lowest rank's file)."""
    for attempt in reversed(attempts):
        for _, path in _rank_files(run_dir, attempt, RankFile.PLAN):
            try:
                data = json.loads(read_regular(path))
                unit, length = data["unit"], data["length"]
            except (OSError, ValueError, TypeError, KeyError):
                continue  # no plan read: `completed` does not run, so it is not verified
            if unit in _UNIT_NOUN and _is_int(length) and length >= 1:
                return Planned(unit, length, _planner(data.get("integration")))
    return None


def _planner(integration: object) -> str:
    """Who declared a plan: the script (ctx.plan()) or an integration from its framework's
    own state (the Lightning trainer's, the Trainer's `max_steps`...)."""
    if isinstance(integration, str) and integration in Integration.__members__.values():
        return f"the {integration} integration"
    return "ctx.plan()"


def _read_save_failures(run_dir: Path, final: int | None
                        ) -> tuple[tuple[SaveFailure, ...], int]:
    """The failed checkpoint saves the final attempt's ranks recorded, and their count."""
    if final is None:
        return (), 0
    found: list[SaveFailure] = []
    total = 0
    for rank, path in _rank_files(run_dir, final, RankFile.SAVE_FAILURES):
        try:
            data = json.loads(read_regular(path))
            total += int(data["count"])
            found += [SaveFailure(rank, int(f["step"]), float(f["time"]), str(f["error"]))
                      for f in data["failures"]]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            total += 1  # a record that cannot be read still says a save failed
            found.append(SaveFailure(rank, -1, math.inf, f"its record is unreadable ({exc})"))
    return tuple(sorted(found, key=lambda f: (f.time, f.rank))), total


def _progress_times(run_dir: Path, final: int | None) -> dict[int, float]:
    """The time of each rank's last progress call in the final attempt (its heartbeat)."""
    if final is None:
        return {}
    times = {}
    for rank, path in _rank_files(run_dir, final, RankFile.HEARTBEAT):
        try:
            when = json.loads(read_regular(path)).get("progress_time")
        except (OSError, ValueError, AttributeError):
            continue  # no time: every error in its log counts as after its last progress
        if isinstance(when, int | float) and math.isfinite(when):
            times[rank] = float(when)
    return times


@dataclass
class _MetricsSummary:
    names: set[str] = field(default_factory=set)
    lines: int = 0
    non_finite: list[MetricPoint] = field(default_factory=list)
    non_finite_count: int = 0
    unreadable: int = 0
    first_unreadable: str | None = None
    highest: dict[str, int] = field(default_factory=dict)  # by kind, every attempt
    lowest: dict[str, int] = field(default_factory=dict)
    final_step: int | None = None  # the final attempt's highest step
    final_time: float | None = None  # the final attempt's latest report
    validation_highest: dict[str, float] = field(default_factory=dict)  # by metric name
    steps: frozenset[int] = frozenset()  # a few distinct steps (`metrics_lines.few_steps`)


def _read_metrics(run_dir: Path, attempts: Sequence[int]) -> _MetricsSummary:
    """Summarize every rank's metrics file; a torn last line (no newline) is not an error."""
    summary = _MetricsSummary()
    for attempt in attempts:
        for rank, path in _rank_files(run_dir, attempt, RankFile.METRICS):
            _read_metrics_file(path, attempt, rank, summary, _relative(path, run_dir),
                               final=attempt == attempts[-1])
    return summary


def _note_step(summary: _MetricsSummary, record: MetricLine, final: bool) -> None:
    kind, step = record.kind, record.step
    summary.highest[kind] = max(summary.highest.get(kind, step), step)
    summary.lowest[kind] = min(summary.lowest.get(kind, step), step)
    if len(summary.steps) < metrics_lines.STEPS_KEPT:
        summary.steps = metrics_lines.few_steps(summary.steps, (step,))
    if final:
        summary.final_step = max(summary.final_step if summary.final_step is not None
                                 else step, step)
        summary.final_time = max(summary.final_time or record.time, record.time)


def _read_metrics_file(
    path: Path, attempt: int, rank: int, summary: _MetricsSummary, shown_as: str,
    final: bool = False,
) -> None:
    kept_here = 0
    with os.fdopen(open_regular(path), "rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not metrics_lines.is_complete(line):
                continue  # a torn last line: not written yet, so not judged
            try:
                record = metrics_lines.parse(line, rank)
            except metrics_lines.BadLine:
                summary.unreadable += 1
                summary.first_unreadable = summary.first_unreadable or f"{shown_as}:{number}"
                continue
            if record is None:
                continue
            summary.lines += 1
            _note_step(summary, record, final)
            if record.kind == MetricKind.VALIDATION:
                _note_highest(summary.validation_highest, record.metrics)
            for point in _non_finite_points(record, attempt, summary.names):
                summary.non_finite_count += 1
                if kept_here < KEPT_NON_FINITE_PER_FILE:
                    summary.non_finite.append(point)
                    kept_here += 1


def _note_highest(highest: dict[str, float], metrics: Mapping[str, object]) -> None:
    for name, value in metrics.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
                value) and value > highest.get(name, -math.inf):
            highest[name] = float(value)


def _non_finite_points(
    record: MetricLine, attempt: int, names: set[str]
) -> Iterable[MetricPoint]:
    """Record every metric name of `record` in `names`; yield its non-finite values."""
    for name, value in record.metrics.items():
        names.add(name)
        if isinstance(value, float) and not math.isfinite(value):
            yield MetricPoint(record.kind, record.step, name, value, attempt, record.rank)


def _read_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """Every published checkpoint under `directory`, checked file by file, best last."""
    return [CheckpointInfo(str(c.path), c.step, c.intact, c.problem,
                           _int_or_none(c.document.get("attempt")),
                           _float_or_none(c.document.get("time")))
            for c in checkpoint_files.inspect_all(directory)]


def _int_or_none(value: Any) -> int | None:
    return value if _is_int(value) else None


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _rank_files(run_dir: Path, attempt: int, kind: RankFile) -> list[tuple[int, Path]]:
    """(rank, path) of each rank's `kind` file in the attempt, by rank."""
    return RunDir(run_dir).attempt(attempt).ranks_with(kind)


def _relative(path: Path, run_dir: Path) -> str:
    return str(path.relative_to(run_dir))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
