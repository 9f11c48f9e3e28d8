"""Metrics read from a replica's log, for scripts that report none through the harness.

Two sources, both searched line by line (a line is cut at `MAX_LINE_BYTES`; tqdm rewrites a
line with "\\r", so each "\\r"-ended piece counts as a line too, under its line's number):

- `verify.metrics_from_log`: the experiment owner's named regexes, metric name → pattern
  with a named group `value` and, optionally, `step` or `epoch`;
- the built-in recognisers (`verify.log_metrics: auto`, on for a script that does not use
  the harness), for what the most used trainers print, each metric named as printed
  ("val loss" → `val_loss`):

  - `hf_dict`, Hugging Face Trainer's ``{'loss': 0.12, 'grad_norm': 1.2, 'learning_rate':
    5e-05, 'epoch': 0.5}`` and ``{'eval_loss': ...}`` (step: the running count of reports);
  - `progress_bar`, Lightning's and any tqdm bar's postfix: ``Epoch 0:  50%|███ | 5/10
    [00:01<00:01, 4.50it/s, loss=0.123, v_num=0]`` (step: epoch * total + n);
  - `plain`: ``loss: 0.123``, ``loss=nan``, ``val loss 5.43``, ``Loss is nan``, nanoGPT's
    ``step 100: train loss 2.34, val loss 2.45``, word_language_model's ``| lr 20.00 |
    loss  6.99 | ppl  1085.61`` (step: a `step N` or `iter N` on the line, else the
    running count).

  `plain` knows the words loss, ppl, perplexity, acc and accuracy, alone or after train,
  training, val, valid, validation, eval, test or dev (NaN and ±inf spelled as Python and
  C print them). A name starting with one of those validation words is a validation
  metric (the searcher's metric is one); the others are training metrics.

The log may be many GiB and the patterns are the owner's, so the search never runs in the
server: a child process (`python -m muster.supervise.log_metrics SPEC`) reads the log from
its stdin and is killed after a timeout, exactly as `log_samples` counts samples (they share
`scan_in_child`). `scan` is the pure part the child runs: from a `Position` (byte offset,
line count, reports so far) it returns what it recognised and where it stopped, so that
ingestion (`log_metrics_ingest`) can go on from there, and `log_metric_evidence` is what
verification reads: every name seen and every NaN or infinity, with its line and offset.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NotRequired, TypedDict

from muster.launch.logs import ReplicaLog, drops_of, open_log
from muster.metrics_lines import few_steps, name_problem
from muster.states import MetricKind
from muster.supervise.log_samples import (
    IN_PROCESS_BYTES,
    MAX_LINE_BYTES,
    bounded_lines,
    limit_cpu,
    scan_in_child,
)

if TYPE_CHECKING:
    from muster.config import ExperimentConfig
    from muster.launch.base import Launcher

__all__ = [
    "KEPT_NON_FINITE", "MAX_REPORTS_KEPT", "LogMetricEvidence", "LogReport",
    "NonFiniteValue", "Position", "ScanResult", "ScanSpec", "builtin_recognisers_apply",
    "compile_patterns", "log_metric_evidence", "recognise", "scan",
    "scan_log",
]

MAX_REPORTS_KEPT = 10_000  # per rank log, in full; past it one in 2, 4, 8... (`_kept`)
KEPT_NON_FINITE = 5  # per rank log, named one by one in the evidence; the rest are counted
DEFAULT_TIMEOUT_S = 60.0

_NUMBER = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?))"
_VALIDATION = re.compile(r"(?i)(?:eval|val|valid|validation|test|dev)[_/]")
_HF_DICT = re.compile(r"\{'[^']+':.*\}")
_HF_PAIR = re.compile(r"'(?P<name>[^'\\]{1,128})':\s*(?:np\.float\d+\(|tensor\()?"
                      rf"(?P<value>{_NUMBER})\)?(?=\s*[,}}])")
# tqdm's bar (Lightning's among them): "| 5/10 [00:01<00:01, 4.50it/s, loss=0.123]".
_BAR = re.compile(r"(?:^|\s)(?:Epoch (?P<epoch>\d+)(?:/\d+)?:)?.*?\|\s*(?P<n>\d+)/"
                  r"(?P<total>\d+|\?)\s*\[(?P<postfix>[^\]]*)\]")
_BAR_PAIR = re.compile(rf"(?:^|,)\s*(?P<name>[A-Za-z_][\w./:@+-]{{0,127}})=(?P<value>{_NUMBER})"
                       r"(?=\s*(?:,|$))")
_WHERE_NAMES = frozenset({"epoch", "step"})
_BAR_SKIPPED = frozenset({"v_num"})  # Lightning's logger version, not a metric
_PLAIN = re.compile(
    r"(?i)(?<![\w.])(?P<name>(?:(?:train|training|val|valid|validation|eval|test|dev)[ _])?"
    r"(?:loss|ppl|perplexity|acc|accuracy))"
    rf"(?:\s*[:=]\s*|\s+(?:is\s+|was\s+)?)(?P<value>{_NUMBER})(?!\w)")
_PLAIN_STEP = re.compile(r"(?i)(?<!\w)(?:step|iter|iteration)\s*[:=]?\s*(?P<step>\d{1,18})\b")


@dataclass(frozen=True)
class LogReport:
    """The metrics one log line holds, of one kind (a line may hold both kinds: two)."""

    kind: MetricKind
    step: int
    values: dict[str, float]
    line: int  # 1-based, counting "\n"
    offset: int  # of the piece of the line that holds them


@dataclass(frozen=True)
class NonFiniteValue:
    """A NaN or infinity read from a log, and where."""

    name: str
    value: float
    step: int
    attempt: int
    rank: int
    line: int
    offset: int

    def describe(self) -> str:
        """E.g. "loss was nan at line 1,204 of rank 0"."""
        return f"{self.name} was {_spelled(self.value)} at line {self.line:,} of rank {self.rank}"


@dataclass(frozen=True)
class Position:
    """Where a scan of one log starts or stopped: a byte offset (at the start of a line or
    of a "\\r"-ended piece of one), the "\\n"s before it, and the reports made before it."""

    offset: int = 0
    lines: int = 0
    reports: int = 0


@dataclass(frozen=True)
class ScanSpec:
    """What a scan looks for, and what it keeps."""

    patterns: Mapping[str, str] = field(default_factory=dict)  # name → regex
    builtin: bool = True
    start: Position = field(default_factory=Position)
    final: bool = False  # the log is complete: a last line without its "\n" counts too
    keep_reports: bool = True  # False: only the summary (names, counts, non-finite values)

    def to_json(self) -> str:
        return json.dumps({"patterns": dict(self.patterns), "builtin": self.builtin,
                           "start": [self.start.offset, self.start.lines, self.start.reports],
                           "final": self.final, "keep_reports": self.keep_reports})

    @classmethod
    def from_json(cls, text: str) -> ScanSpec:
        data = json.loads(text)
        return cls(data["patterns"], data["builtin"], Position(*data["start"]), data["final"],
                   data["keep_reports"])


class ScanResultJson(TypedDict):
    """A `ScanResult` as a scan's child process prints it (its `problem` stays behind)."""

    end: list[int]  # [offset, lines, reports]
    reports: list[list[Any]]  # [kind, step, values, line, offset] each
    names: list[str]
    values: int
    non_finite: list[list[Any]]  # [name, value, step, line, offset] each
    non_finite_count: int
    unusable: int
    highest: NotRequired[dict[str, int]]
    lowest: NotRequired[dict[str, int]]
    last_offset: NotRequired[int | None]
    steps: NotRequired[list[int]]


@dataclass
class ScanResult:
    """What a scan recognised, and where it stopped."""

    end: Position
    reports: list[LogReport] = field(default_factory=list)  # those kept (`_kept`)
    names: set[str] = field(default_factory=set)
    values: int = 0
    non_finite: list[tuple[str, float, int, int, int]] = field(default_factory=list)
    non_finite_count: int = 0  # (name, value, step, line, offset) of the first few above
    unusable: int = 0  # named-regex matches whose `value` was no number
    problem: str | None = None
    # How far the log says training got: the lowest and highest step of each kind, and
    # where the last report was printed (the last progress, for verification).
    highest: dict[str, int] = field(default_factory=dict)
    lowest: dict[str, int] = field(default_factory=dict)
    last_offset: int | None = None
    steps: frozenset[int] = frozenset()  # a few distinct steps reported (`few_steps`)

    def to_json(self) -> ScanResultJson:
        return ScanResultJson(
            end=[self.end.offset, self.end.lines, self.end.reports],
            reports=[[r.kind, r.step, r.values, r.line, r.offset] for r in self.reports],
            names=sorted(self.names), values=self.values,
            non_finite=[list(v) for v in self.non_finite],
            non_finite_count=self.non_finite_count, unusable=self.unusable,
            highest=self.highest, lowest=self.lowest, last_offset=self.last_offset,
            steps=sorted(self.steps))

    def followed_by(self, later: ScanResult) -> ScanResult:
        """This result and `later`'s (a scan from where this one stopped) as one."""
        highest, lowest = dict(self.highest), dict(self.lowest)
        for kind, step in later.highest.items():
            highest[kind] = max(highest.get(kind, step), step)
        for kind, step in later.lowest.items():
            lowest[kind] = min(lowest.get(kind, step), step)
        return ScanResult(
            later.end, self.reports + later.reports, self.names | later.names,
            self.values + later.values, (self.non_finite + later.non_finite)[:KEPT_NON_FINITE],
            self.non_finite_count + later.non_finite_count, self.unusable + later.unusable,
            later.problem or self.problem, highest, lowest,
            later.last_offset if later.last_offset is not None else self.last_offset,
            few_steps(self.steps, later.steps))

    @classmethod
    def from_json(cls, data: ScanResultJson) -> ScanResult:
        return cls(Position(*data["end"]), [LogReport(*r) for r in data["reports"]],
                   set(data["names"]), data["values"],
                   [tuple(v) for v in data["non_finite"]],
                   data["non_finite_count"], data["unusable"],
                   highest=dict(data.get("highest", {})), lowest=dict(data.get("lowest", {})),
                   last_offset=data.get("last_offset"),
                   steps=few_steps(frozenset(), data.get("steps", [])))


# -- configuration -------------------------------------------------------------------------


def compile_patterns(patterns: Mapping[str, str]) -> dict[str, re.Pattern[str]]:
    return {name: re.compile(pattern) for name, pattern in patterns.items()}


def builtin_recognisers_apply(config: ExperimentConfig, harness_metrics: bool) -> bool:
    """Whether the built-in recognisers read this trial's logs: `verify.log_metrics: auto`,
    no `harness: true`, and no metrics file written (`harness_metrics`)."""
    return config.verify.log_metrics == "auto" and not config.harness and not harness_metrics


# -- recognising (pure) --------------------------------------------------------------------

Found = tuple[dict[str, float], int | None]  # the values of one line, and its step if it says


def recognise(text: str, patterns: Mapping[str, re.Pattern[str]] | None = None,
              builtin: bool = True) -> tuple[Found, int]:
    """The metrics on one line (without its line end), and how many named-regex matches
    had no number for `value`. The named regexes come first; then the first built-in
    recogniser that reads the line (`hf_dict`, `progress_bar`, `plain`)."""
    values: dict[str, float] = {}
    step: int | None = None
    unusable = 0
    for name, pattern in (patterns or {}).items():
        found = pattern.search(text)
        if found is None:
            continue
        value = _number(found["value"])
        if value is None:
            unusable += 1
            continue
        values[name] = value
        if step is None:
            step = _first_whole(found, ("step", "epoch"))
    if builtin:
        more, more_step = _builtin(text)
        for name, value in more.items():
            values.setdefault(name, value)
        step = step if step is not None else more_step
    return (values, step), unusable


def _builtin(text: str) -> Found:
    for recogniser in (_hf_dict, _progress_bar, _plain):
        values, step = recogniser(text)
        if values:
            return values, step
    return {}, None


def _hf_dict(text: str) -> Found:
    stripped = text.strip()
    if not stripped.startswith("{'") or _HF_DICT.fullmatch(stripped) is None:
        return {}, None
    return _pairs(_HF_PAIR.finditer(stripped)), None


def _progress_bar(text: str) -> Found:
    bar = _BAR.search(text)
    if bar is None:
        return {}, None
    values = _pairs(m for m in _BAR_PAIR.finditer(bar["postfix"])
                    if m["name"] not in _BAR_SKIPPED)
    n, total = int(bar["n"]), bar["total"]
    epoch = bar["epoch"]
    step = int(epoch) * int(total) + n if epoch is not None and total != "?" else n
    return values, step


def _plain(text: str) -> Found:
    values: dict[str, float] = {}
    for found in _PLAIN.finditer(text):
        name = re.sub(r"\s+", "_", found["name"].lower())
        value = _number(found["value"])
        if value is not None:
            values.setdefault(name, value)
    if not values:
        return {}, None
    step = _PLAIN_STEP.search(text)
    return values, int(step["step"]) if step is not None else None


def _pairs(matches: Iterator[re.Match[str]]) -> dict[str, float]:
    values: dict[str, float] = {}
    for found in matches:
        value = _number(found["value"])
        if value is not None and name_problem(found["name"]) is None:
            values.setdefault(found["name"], value)
    return values


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.strip())
    except ValueError:
        return None


def _first_whole(found: re.Match[str], groups: Sequence[str]) -> int | None:
    for group in groups:
        if group in found.re.groupindex and found[group] is not None:
            text = found[group].strip()
            if text.isascii() and text.isdigit() and len(text) <= 18:
                return int(text)
    return None


def _kind(name: str) -> MetricKind:
    return MetricKind.VALIDATION if _VALIDATION.match(name) else MetricKind.TRAINING


def _spelled(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


# -- scanning (pure; the child runs it) ----------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    text: bytes
    offset: int
    line: int  # 1-based
    ends_line: bool  # a "\n" follows it
    end: int  # the offset after it and its "\r" or "\n"


def _pieces(stream: BinaryIO, start: Position, final: bool) -> Iterator[_Piece]:
    """The "\\r"- or "\\n"-ended pieces of the log from `start`, each cut at
    `MAX_LINE_BYTES`; a last piece without its end is held back unless the log is `final`
    (it may still be being written)."""
    at, line = start.offset, start.lines + 1
    held, held_at = b"", None  # a piece going on in the next chunk: its start, and where
    for chunk in bounded_lines(stream):
        ended = chunk.endswith(b"\n")
        parts = (chunk[:-1] if ended else chunk).split(b"\r")
        for i, part in enumerate(parts):
            begins = at if held_at is None else held_at
            text = (held + part)[:MAX_LINE_BYTES] if held_at is not None else part[:MAX_LINE_BYTES]
            at += len(part)
            if i == len(parts) - 1 and not ended:
                held, held_at = text, begins  # it goes on in the next chunk
                continue
            at += 1
            held, held_at = b"", None
            yield _Piece(text, begins, line, ended and i == len(parts) - 1, at)
        if ended:
            line += 1
    if held_at is not None and final and at > held_at:
        yield _Piece(held, held_at, line, False, at)


def scan(stream: BinaryIO, spec: ScanSpec) -> ScanResult:
    """What `spec` recognises in `stream` (the log from `spec.start.offset` on)."""
    patterns = compile_patterns(spec.patterns)
    result = ScanResult(spec.start)
    reports, lines, offset = spec.start.reports, spec.start.lines, spec.start.offset
    first_bad: set[str] = set()
    last: tuple[int, dict[str, float]] | None = None
    for piece in _pieces(stream, spec.start, spec.final):
        offset = piece.end
        (values, step), unusable = recognise(
            piece.text[:MAX_LINE_BYTES].decode("utf-8", errors="replace"), patterns,
            spec.builtin)
        result.unusable += unusable
        if piece.ends_line:
            lines += 1
        if not values:
            continue
        step = reports if step is None else step
        if last is not None and last == (step, values):
            continue  # a progress bar redrawn with the same values
        last = (step, values)
        bad = _note(result, values, step, piece)
        _note_progress(result, values, step, piece)
        if spec.keep_reports and (_kept(reports) or (bad - first_bad)):
            result.reports.extend(_reports(values, step, piece))
        first_bad |= bad
        reports += 1
    result.end = Position(offset, lines, reports)
    return result


def _note(result: ScanResult, values: dict[str, float], step: int, piece: _Piece) -> set[str]:
    """Count the values in the summary; returns the names of the non-finite ones."""
    result.names.update(values)
    result.values += len(values)
    bad = set()
    for name, value in values.items():
        if math.isfinite(value):
            continue
        bad.add(name)
        result.non_finite_count += 1
        if len(result.non_finite) < KEPT_NON_FINITE:
            result.non_finite.append((name, value, step, piece.line, piece.offset))
    return bad


def _note_progress(result: ScanResult, values: dict[str, float], step: int,
                   piece: _Piece) -> None:
    """Keep the lowest and highest step of each kind, and where this report was."""
    for report in _reports(values, step, piece):
        kind = report.kind
        result.highest[kind] = max(result.highest.get(kind, step), step)
        result.lowest[kind] = min(result.lowest.get(kind, step), step)
        result.steps = few_steps(result.steps, (step,))
    result.last_offset = piece.offset


def _reports(values: dict[str, float], step: int, piece: _Piece) -> list[LogReport]:
    by_kind: dict[MetricKind, dict[str, float]] = {}
    for name, value in values.items():
        by_kind.setdefault(_kind(name), {})[name] = value
    if (MetricKind.VALIDATION in by_kind
            and by_kind.get(MetricKind.TRAINING, {}).keys() <= _WHERE_NAMES):
        # Hugging Face's {'eval_loss': ..., 'epoch': 1.0}: the epoch says where the
        # validation was, it is no training report of its own.
        by_kind[MetricKind.VALIDATION].update(by_kind.pop(MetricKind.TRAINING, {}))
    return [LogReport(kind, step, kind_values, piece.line, piece.offset)
            for kind, kind_values in sorted(by_kind.items())]


def _kept(number: int) -> bool:
    """Whether the `number`th report of a log (from 0) is stored: the first
    `MAX_REPORTS_KEPT`, then one in 2 up to twice that, one in 4 up to four times... so a
    log of any length stores `MAX_REPORTS_KEPT` * (1 + log2(reports / it) / 2) at most."""
    if number < MAX_REPORTS_KEPT:
        return True
    stride = 1 << (number // MAX_REPORTS_KEPT).bit_length()
    return number % stride == 0


# -- in a child process --------------------------------------------------------------------


def scan_log(log: ReplicaLog, spec: ScanSpec, timeout: float = DEFAULT_TIMEOUT_S,
             limit: int | None = None) -> ScanResult:
    """`scan` of `log` from `spec.start` (at most `limit` bytes of the file), in a child
    process killed after `timeout` seconds (then `problem` says so, and nothing is read).

    A log held to its limit is scanned stretch by stretch around its dropped ranges (one
    ends the line before it), each from its own offset, and the results joined."""
    stream = open_log(log)
    if stream is None:
        return ScanResult(spec.start)
    with stream:
        size = stream.seek(0, 2)
        end = size if limit is None else min(size, spec.start.offset + limit)
        stretches = drops_of(stream).spans(spec.start.offset, end)
        result = ScanResult(spec.start)
        for number, (start, stop) in enumerate(stretches):
            last = number == len(stretches) - 1
            part = _scan_stretch(stream, dataclasses.replace(
                spec, start=dataclasses.replace(result.end, offset=start),
                final=spec.final or not last), stop - start, timeout)
            result = part if number == 0 else result.followed_by(part)
            if part.problem is not None:
                break
    return result


def _scan_stretch(stream: BinaryIO, spec: ScanSpec, part: int, timeout: float) -> ScanResult:
    """`scan` of `part` bytes of `stream` (none of them dropped) from `spec.start`."""
    stream.seek(spec.start.offset)
    if not spec.patterns and part <= IN_PROCESS_BYTES:
        # Only the built-in recognisers, muster's own expressions, over a small part:
        # read here (a child's start-up would cost more than the read).
        return scan(io.BytesIO(stream.read(part)), spec)
    answer = scan_in_child(__name__, [spec.to_json()], stream, timeout, part)
    if answer.problem is not None:
        return ScanResult(spec.start, problem=f"reading metrics from the log {answer.problem}")
    return ScanResult.from_json(json.loads(answer.out))


def main(argv: list[str]) -> int:
    """`python -m muster.supervise.log_metrics SPEC [CPU_SECONDS]` < log from SPEC's start:
    prints the `ScanResult` as JSON; the kernel stops it after CPU_SECONDS of CPU time."""
    if len(argv) > 1:
        argv = limit_cpu(argv)
    result = scan(sys.stdin.buffer, ScanSpec.from_json(argv[0]))
    json.dump(result.to_json(), sys.stdout)
    return 0


# -- evidence for verification -------------------------------------------------------------


@dataclass(frozen=True)
class LogMetricEvidence:
    """What the rank logs of a trial's attempts say about its metrics."""

    names: frozenset[str] = frozenset()
    values: int = 0
    non_finite: tuple[NonFiniteValue, ...] = ()  # the first few of each log
    non_finite_count: int = 0
    problems: tuple[str, ...] = ()  # e.g. "attempt 1, rank 0: reading ... took longer ..."
    scanned: bool = False  # False: neither a named regex nor the recognisers applied
    # Progress: the lowest and highest step of each kind over every attempt; the final
    # attempt's highest step and, per rank, the log offset of its last report.
    highest: Mapping[str, int] = field(default_factory=dict)
    lowest: Mapping[str, int] = field(default_factory=dict)
    final_step: int | None = None
    last_offsets: Mapping[int, int] = field(default_factory=dict)
    steps: frozenset[int] = frozenset()  # a few distinct steps, any kind (`few_steps`)

    def describe(self) -> str | None:
        """The first non-finite value in words ("loss was nan at line 1,204 of rank 0"),
        and how many more there are; None when there is none."""
        if not self.non_finite:
            return None
        first = min(self.non_finite, key=lambda v: (v.attempt, v.rank, v.offset))
        words = first.describe()
        if any(v.attempt != first.attempt for v in self.non_finite):
            words += f" (attempt {first.attempt})"
        rest = self.non_finite_count - 1
        return words + (f"; and {rest:,} more non-finite value{'s' * (rest != 1)}"
                        if rest else "")


def log_metric_evidence(launcher: Launcher,
                        attempts_and_ranks: Mapping[int, tuple[Path, Sequence[int]]],
                        config: ExperimentConfig, harness_metrics: bool = False,
                        timeout: float = DEFAULT_TIMEOUT_S) -> LogMetricEvidence:
    """Every metric `verify.metrics_from_log` and (where they apply,
    `builtin_recognisers_apply`) the built-in recognisers read in the rank logs of these
    attempts (attempt number → its directory and ranks), each log whole, in a child process.

    Args:
        harness_metrics: the trial wrote metrics files (the recognisers then stay off).
    """
    spec = ScanSpec(config.verify.metrics_from_log,
                    builtin_recognisers_apply(config, harness_metrics), final=True,
                    keep_reports=False)
    if not spec.patterns and not spec.builtin:
        return LogMetricEvidence()
    names: set[str] = set()
    values = count = 0
    kept: list[NonFiniteValue] = []
    problems: list[str] = []
    highest: dict[str, int] = {}
    lowest: dict[str, int] = {}
    final_step: int | None = None
    last_offsets: dict[int, int] = {}
    steps: frozenset[int] = frozenset()
    final = max(attempts_and_ranks, default=None)
    for attempt, (where, ranks) in sorted(attempts_and_ranks.items()):
        for rank in sorted(ranks):
            result = scan_log(launcher.log(where, rank), spec, timeout)
            if result.problem is not None:
                problems.append(f"attempt {attempt}, rank {rank}: {result.problem}")
            names |= result.names
            values += result.values
            count += result.non_finite_count
            kept += [NonFiniteValue(name, value, step, attempt, rank, line, offset)
                     for name, value, step, line, offset in result.non_finite]
            for kind, step in result.highest.items():
                highest[kind] = max(highest.get(kind, step), step)
            for kind, step in result.lowest.items():
                lowest[kind] = min(lowest.get(kind, step), step)
            steps = few_steps(steps, result.steps)
            if attempt == final:
                final_step = max([final_step or 0, *result.highest.values()]) \
                    if result.highest else final_step
                if result.last_offset is not None:
                    last_offsets[rank] = result.last_offset
    return LogMetricEvidence(frozenset(names), values, tuple(kept), count, tuple(problems),
                             scanned=True, highest=highest, lowest=lowest,
                             final_step=final_step, last_offsets=last_offsets, steps=steps)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
