"""Metrics lines: the format of `RankFile.METRICS`, its one writer's templates and its one parser.

One line per report, in the order reported:

    {"kind": "training", "step": 120, "metrics": {"loss": 0.25},
     "time": 1764487282123456789e-9, "rank": 0}            (on one line)

- `kind` is "training" or "validation" in a metrics file (`RankFile.METRICS`), and "system"
  in the shim's file of resource samples (`RankFile.SYSTEM`, `muster.system_metrics`),
  whose lines have the same format; `step` a whole number in [-2**63, 2**63); `rank` the
  rank whose file holds the line; `time` a finite unix time (the harness writes integer
  nanoseconds with an exponent, a JSON number every parser reads as seconds);
- `metrics` maps names to numbers; NaN and ±infinity are the bare tokens `NaN`, `Infinity`
  and `-Infinity`, as Python's json module writes them, so verification can see them;
- a name follows `NAME_RULE` (the config's metric and hyperparameter names too): the web UI
  and every tool that shows a name can then never be handed markup or control characters;
- a line is complete once its newline is written: a torn last line (a writer killed in the
  middle of a write) is not a line yet, and no reader judges it; a blank line is no report.

The harness writes with `template`; ingestion (what the store holds) and verification (what
an exit 0 is judged by) read with `parse`, so the two can never disagree about a line.
Standard library only: the harness imports this inside the user's training process.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from muster.states import MetricKind

__all__ = [
    "NAME_PATTERN", "NAME_RULE", "REPORTED_KINDS", "SYSTEM_KINDS", "BadLine", "MetricLine",
    "exact_template", "is_complete", "json_number", "name_problem", "parse", "template",
]

_STEP_LIMIT = 1 << 63
# What the run itself may report: a "system" line in a metrics file is refused, so a script
# can never pass its own reports off as the shim's samples, nor the reverse.
REPORTED_KINDS = frozenset({MetricKind.TRAINING, MetricKind.VALIDATION})
SYSTEM_KINDS = frozenset({MetricKind.SYSTEM})
# What real code reports passes (Lightning's `train/loss`, `lr-Adam/pg1`, `loss_step`;
# Hugging Face's `eval_accuracy`; `top1@5`, `val:acc`, `f1+`); what a page or a terminal
# could read as markup, quoting or control (`<`, `>`, `&`, quotes, backticks, whitespace,
# control characters) does not.
NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_./:@+-]{0,127}"
NAME_RULE = ("1 to 128 characters: letters, digits and _ . / : @ + -, the first a letter, a "
             "digit or _")
_NAME = re.compile(NAME_PATTERN)
_SHOWN_CHARS = 60
# Names that passed: a run reports the same few on every line, and a set lookup per line
# costs a tenth of the pattern per name.
_GOOD_NAMES: set[str] = set()
_GOOD_NAMES_KEPT = 4096


class BadLine(ValueError):
    """A complete line that is not a report in the documented format; the message says why."""


@dataclass(frozen=True, slots=True)
class MetricLine:
    """One report, as read from a metrics file."""

    kind: MetricKind
    step: int
    time: float
    rank: int
    metrics: dict[str, int | float]


# How many distinct steps a reading keeps (`few_steps`): enough to tell a run that reported
# one or two steps from one that reported a series (a warm start's own progress:
# `muster.supervise.verification`).
STEPS_KEPT = 3


def few_steps(kept: frozenset[int], more: Iterable[int]) -> frozenset[int]:
    """`kept` and as many of `more` as fit in STEPS_KEPT distinct steps."""
    steps = set(kept)
    for step in more:
        if len(steps) >= STEPS_KEPT:
            break
        steps.add(step)
    return frozenset(steps)


def is_complete(line: bytes) -> bool:
    """Whether `line` (as read, with its newline if it has one) has been wholly written."""
    return line.endswith(b"\n")


def parse(line: bytes | str, rank: int,
          kinds: frozenset[MetricKind] = REPORTED_KINDS) -> MetricLine | None:
    """The report on one complete line of rank `rank`'s metrics file; None for a blank line.

    Args:
        kinds: the kinds the file may hold: `REPORTED_KINDS` in a metrics file,
            `SYSTEM_KINDS` in a file of resource samples.

    Raises:
        BadLine: the line is not JSON, or not a report in the documented format.
    """
    if not line.strip():
        return None
    report = _decoded(line)
    if not isinstance(report, dict):
        raise BadLine(f"a report is a JSON object, got {type(report).__name__}")
    kind: Any = report.get("kind")
    step: Any = report.get("step")
    at: Any = report.get("time")
    stated_rank: Any = report.get("rank")
    metrics: Any = report.get("metrics")
    if not isinstance(kind, str) or kind not in kinds:
        allowed = " or ".join(f'"{k}"' for k in sorted(kinds))
        raise BadLine(f'"kind" must be {allowed}, got {kind!r}')
    kind = MetricKind(kind)
    if not _is_int(step) or not -_STEP_LIMIT <= step < _STEP_LIMIT:
        raise BadLine(f'"step" must be a whole number, got {step!r}')
    if not _is_finite(at):
        raise BadLine(f'"time" must be a finite unix time, got {at!r}')
    if not _is_int(stated_rank) or stated_rank != rank:
        raise BadLine(f'"rank" must be {rank} in rank {rank}\'s file, got {stated_rank!r}')
    if not isinstance(metrics, dict):
        raise BadLine(f'"metrics" must be an object of numbers, got {metrics!r}')
    if not _GOOD_NAMES.issuperset(metrics):
        _check_names(metrics)
    for name, value in metrics.items():
        if type(value) is not float and not _is_number(value):  # a float: the usual
            raise BadLine(f'"metrics" must map names to numbers; {name!r} is {value!r}')
    return MetricLine(kind, step, float(at), rank, metrics)


def _decoded(line: str | bytes) -> Any:
    """The JSON value `line` holds, as `json.loads` reads it (surrounding whitespace
    allowed, nothing else after the value), through the C scanner at once: ingestion calls
    this per line, and `json.loads`'s own steps cost as much as the decoding.

    Raises:
        BadLine: not one JSON value (or not UTF-8), with `json.loads`'s words for it.
    """
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
        value, end = _SCAN(text, 0)
        if end == len(text) or not text[end:].strip(_JSON_SPACE):
            return value
    except (StopIteration, ValueError, RecursionError):
        pass  # a value that does not start at 0, or none: json.loads says which
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BadLine(f"not valid JSON ({exc})") from None


# (text, index) -> (value, end): the decoder's scanner, C where built (set in its __init__)
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"  # what JSON counts as whitespace (str.strip() takes more)


def name_problem(name: str, what: str = "metric") -> str | None:
    """Why `name` cannot be a `what`'s name (the sentence states `NAME_RULE`), or None.

    Args:
        what: "metric" or "hyperparameter", for the sentence.
    """
    if _NAME.fullmatch(name):
        return None
    shown = repr(name) if len(name) <= _SHOWN_CHARS else repr(name[:_SHOWN_CHARS]) + "..."
    return f"a {what} name must be {NAME_RULE}; got {shown}"


def _check_names(names: Iterable[str]) -> None:
    for name in names:
        problem = name_problem(name)
        if problem is not None:
            raise BadLine(f'"metrics": {problem}')
        if len(_GOOD_NAMES) < _GOOD_NAMES_KEPT:
            _GOOD_NAMES.add(name)


def template(kind: str, names: tuple[str, ...], rank: int) -> str:
    """The %-template of a line of `kind` reporting `names`, for rank `rank`: `% (step,
    *values, time_ns)` makes the line. It formats each value with %r, which is right for
    every finite number (`exact_template` is its twin for NaN and the infinities).

    Raises:
        ValueError: `kind` is not a kind of report, `names` is empty, or a name breaks
            `NAME_RULE` (the message states the rule).
    """
    if kind not in tuple(MetricKind):
        raise ValueError(f"kind must be one of {', '.join(MetricKind)}, got {kind!r}")
    if not names:
        raise ValueError("metrics is empty: report at least one metric")
    for name in names:
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(f"{problem} (rename it where the script reports it)")
    # A name has no %, quote or backslash (NAME_RULE): it is its own JSON text, and
    # `": %r` only ever ends a key.
    keys = [f'"{name}"' for name in names]
    head = f'{{"kind": "{kind}", "step": %d, "metrics": {{'
    # The time is integer nanoseconds written as a JSON number with an exponent
    # ("time": 1764487282123456789e-9): %d of an int costs a fifth of %.6f.
    tail = f'}}, "time": %de-9, "rank": {rank}}}\n'
    return head + ", ".join(f"{key}: %r" for key in keys) + tail


def exact_template(line_template: str) -> str:
    """`line_template` with %s for each value, to take its JSON text (`json_number`)."""
    return line_template.replace('": %r', '": %s')


def json_number(value: float | int) -> str:
    """`value` as JSON text: NaN and the infinities as the tokens the parser reads back."""
    if type(value) is int:
        return int.__repr__(value)
    if value - value == 0.0:
        return float.__repr__(value)
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    try:
        return _is_number(value) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False
