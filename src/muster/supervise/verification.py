"""The verdict on a trial whose primary replica exited 0 (invariant 1: no false success).

Plan, then act: `gather_evidence` reads the run directory (docs/run-directory.md) into plain
data, and `verify`, a pure function, decides. A trial whose verdict fails is SUSPECT with
the failed checks' details as its reasons.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from muster import checkpoint_files, metrics_lines
from muster.atomic import open_regular, read_regular
from muster.config import DiagnosticsConfig, VerifyConfig
from muster.diagnostics import bias, diff, read_rank_parts, read_rank_records
from muster.metrics_lines import MetricLine
from muster.rundir import RankFile, RunDir
from muster.supervise.log_samples import LogSamples
from muster.words import NOT_VERIFIED, count, rank_list

__all__ = [
    "NOT_VERIFIED",
    "RESULT_CHECKS",
    "Check",
    "CheckpointInfo",
    "Evidence",
    "LogCounts",
    "MetricPoint",
    "OutputFile",
    "Verdict",
    "VerifyConfig",
    "combine_log_counts",
    "gather_evidence",
    "rank_differences",
    "verify",
]

MINUS = "\u2212"  # U+2212, a real minus sign for negative percentages
SHOWN_NON_FINITE = 5  # non-finite values named in a detail; the rest are counted
SHOWN_DIFFERENCES = 5  # rank differences named in consistent_ranks; the rest are counted
KEPT_NON_FINITE_PER_FILE = SHOWN_NON_FINITE  # enough to name the first ones of any file


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

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class OutputFile:
    """A file the config says the run must write (`verify.outputs`), as found."""

    path: str  # as the config names it, relative to the trial's working directory
    size: int | None  # None: missing (or not a regular file)
    modified_at: float | None


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


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


# The checks that look at what the run produced. An exit 0 is *verified* only when one of
# them ran and every check passed; the others (finite metrics, readable metric lines,
# check-ins) pass vacuously for a script that reports nothing.
RESULT_CHECKS = frozenset({"samples", "checkpoint", "require_metrics", "outputs",
                           "samples_from_log"})


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: list[Check]

    @property
    def verified(self) -> bool:
        """Every check passed, and at least one of them inspected the run's results."""
        return self.passed and any(c.name in RESULT_CHECKS for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "verified": self.verified,
            "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail}
                       for c in self.checks],
        }


# --- the decision -------------------------------------------------------------------------


def verify(
    evidence: Evidence, config: VerifyConfig, manifest_file_count: int | None,
    harness_ranks: int | None = None, diagnostics: DiagnosticsConfig | None = None,
) -> Verdict:
    """Judge `evidence`; the verdict passes only if every check that applies passed.

    `harness_ranks` is the world size when the config declares `harness: true` (every rank
    of the final attempt must then have checked in), None when it does not. `diagnostics`
    says how the coded-bias checks judge (`diagnostics.*`; the defaults when None).
    """
    expected = (config.expected_samples if config.expected_samples is not None
                else manifest_file_count)
    harness = evidence.harness_used or harness_ranks is not None
    require_checkpoint = (harness if config.require_checkpoint is None
                          else config.require_checkpoint)
    checks = [
        _check_check_ins(evidence, harness_ranks) if harness_ranks is not None else None,
        _check_samples(evidence, expected, config.samples_tolerance)
        if expected is not None and (config.samples_from_log is None or evidence.harness_used)
        else None,
        _check_checkpoint(evidence.checkpoints) if require_checkpoint else None,
        _check_finite_metrics(evidence) if config.finite_metrics else None,
        _check_required_metrics(evidence.metric_names, config.require_metrics)
        if config.require_metrics else None,
        _check_log_samples(evidence.log_counts, expected, config.samples_tolerance)
        if config.samples_from_log is not None and expected is not None else None,
        _check_outputs(evidence.outputs, evidence.started_at) if config.outputs else None,
        _check_metrics_readable(evidence),
        _check_consistent_ranks(evidence.rank_snapshots, config.consistent_ranks)
        if config.consistent_ranks != "off" and len(evidence.rank_snapshots) > 1 else None,
    ]
    kept = [c for c in checks if c is not None]
    kept += _diagnostics_checks(evidence, diagnostics or DiagnosticsConfig())
    return Verdict(passed=all(c.passed for c in kept), checks=kept)


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
            checks.append(Check(name, True, f"warning: {finding.detail}"))
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
        return Check("consistent_ranks", True, f"warning: {detail}")
    return Check("consistent_ranks", False, f"{detail}; `muster trial diff` compares trials, "
                 "verify.consistent_ranks: warn only warns")


def _check_samples(evidence: Evidence, expected: int, tolerance: float) -> Check:
    """Samples seen in each epoch, summed over ranks, against the expected count."""
    if evidence.unreadable_samples_files:
        files = ", ".join(evidence.unreadable_samples_files)
        return Check("samples", False, f"unreadable sample counts in {files}")
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
    if evidence.non_finite_count == 0:
        what = (count(len(evidence.metric_names), "metric") if evidence.metric_names
                else "no metrics were reported")
        return Check("finite_metrics", True, f"no NaN or infinite value ({what})")
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


def _check_metrics_readable(evidence: Evidence) -> Check:
    bad = evidence.unreadable_metric_lines
    if bad:
        return Check("metrics_readable", False,
                     f"{count(bad, 'unreadable metric line')} "
                     f"(the first at {evidence.first_unreadable_metric_line})")
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
) -> Evidence:
    """Read what the trial's attempts left in `run_dir` (all attempts, any order); with
    `outputs`, which of those files its working directory holds."""
    ordered = sorted(attempts)
    samples, unreadable_samples = _read_samples(run_dir, ordered)
    metrics = _read_metrics(run_dir, ordered)
    heartbeats = {n: _rank_files(run_dir, n, RankFile.HEARTBEAT) for n in ordered}
    return Evidence(
        samples_by_epoch=samples,
        unreadable_samples_files=unreadable_samples,
        metric_names=frozenset(metrics.names),
        metric_lines=metrics.lines,
        non_finite=tuple(metrics.non_finite),
        non_finite_count=metrics.non_finite_count,
        unreadable_metric_lines=metrics.unreadable,
        first_unreadable_metric_line=metrics.first_unreadable,
        checkpoints=tuple(_read_checkpoints(RunDir(run_dir).checkpoints)),
        harness_used=any(heartbeats.values()),
        final_attempt=ordered[-1] if ordered else None,
        checked_in=frozenset(rank for rank, _ in heartbeats[ordered[-1]])
        if ordered else frozenset(),
        log_counts=log_counts or LogCounts(),
        outputs=tuple(_output_file(RunDir(run_dir).workdir, path) for path in outputs),
        started_at=started_at,
        rank_snapshots=(read_rank_parts(RunDir(run_dir).attempt(ordered[-1]).path)
                        if ordered else {}),
        rank_diagnostics=(read_rank_records(RunDir(run_dir).attempt(ordered[-1]).path)
                          if ordered else {}),
    )


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


def _output_file(workdir: Path, relative: str) -> OutputFile:
    try:
        info = (workdir / relative).stat()
    except OSError:
        return OutputFile(relative, None, None)
    if not stat.S_ISREG(info.st_mode):
        return OutputFile(relative, None, None)
    return OutputFile(relative, info.st_size, info.st_mtime)


def _read_samples(
    run_dir: Path, attempts: Sequence[int]
) -> tuple[dict[int, int], tuple[str, ...]]:
    """Samples per epoch, each epoch from the last attempt that reported it; bad files."""
    by_epoch: dict[int, int] = {}
    unreadable: list[str] = []
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
    return dict(sorted(by_epoch.items())), tuple(unreadable)


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


@dataclass
class _MetricsSummary:
    names: set[str] = field(default_factory=set)
    lines: int = 0
    non_finite: list[MetricPoint] = field(default_factory=list)
    non_finite_count: int = 0
    unreadable: int = 0
    first_unreadable: str | None = None


def _read_metrics(run_dir: Path, attempts: Sequence[int]) -> _MetricsSummary:
    """Summarize every rank's metrics file; a torn last line (no newline) is not an error."""
    summary = _MetricsSummary()
    for attempt in attempts:
        for rank, path in _rank_files(run_dir, attempt, RankFile.METRICS):
            _read_metrics_file(path, attempt, rank, summary, _relative(path, run_dir))
    return summary


def _read_metrics_file(
    path: Path, attempt: int, rank: int, summary: _MetricsSummary, shown_as: str
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
            for point in _non_finite_points(record, attempt, summary.names):
                summary.non_finite_count += 1
                if kept_here < KEPT_NON_FINITE_PER_FILE:
                    summary.non_finite.append(point)
                    kept_here += 1


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
    return [CheckpointInfo(str(c.path), c.step, c.intact, c.problem)
            for c in checkpoint_files.inspect_all(directory)]


def _rank_files(run_dir: Path, attempt: int, kind: RankFile) -> list[tuple[int, Path]]:
    """(rank, path) of each rank's `kind` file in the attempt, by rank."""
    return RunDir(run_dir).attempt(attempt).ranks_with(kind)


def _relative(path: Path, run_dir: Path) -> str:
    return str(path.relative_to(run_dir))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
