"""Counted nouns, rank lists, spans of time and a running trial's progress, worded one way
in every message muster writes (the CLI and the pages show progress with `progress_line`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["NOT_VERIFIED", "count", "progress_done", "progress_line", "progress_percent",
           "rank_list", "span"]

# How an exit 0 without the evidence to verify it is shown, followed by why (it is
# SUCCEEDED, not a failure, but never presented as verified).
NOT_VERIFIED = "exit 0 — not verified"


def count(number: int, noun: str, plural: str | None = None) -> str:
    """`count(1, "slot")` -> "1 slot"; `count(3, "retry")` -> "3 retries";
    `count(1797, "sample")` -> "1,797 samples"; `count(2, "match", "matches")` when the
    plural is not the noun with an s."""
    if number != 1 and plural is not None:
        noun = plural
    elif number != 1:
        consonant_y = noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u")
        noun = noun[:-1] + "ies" if consonant_y else noun + "s"
    return f"{number:,} {noun}"


def rank_list(numbers: Sequence[int]) -> str:
    """`rank_list([1])` -> "rank 1"; `rank_list([0, 1, 3])` -> "ranks 0, 1 and 3"."""
    if len(numbers) == 1:
        return f"rank {numbers[0]}"
    return f"ranks {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def span(seconds: float) -> str:
    """`span(45)` -> "45s"; `span(125)` -> "2m 05s"; `span(11040)` -> "3h 04m";
    `span(190800)` -> "2d 5h" (rounded down: a promise kept rather than broken)."""
    whole = max(0, math.floor(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def progress_line(progress: Mapping[str, Any] | None) -> str:
    """A running trial's `progress` view in words: "340 of 1,000 steps (34%), ETA 2m 05s",
    "2 of 4 epochs (50%), ETA unknown", "340 steps, no planned length"; "-" for none."""
    if progress is None:
        return "-"
    planned, unit = progress["planned"], progress["unit"]
    if planned is None:
        return f"{progress_done(progress)}, no planned length"
    eta = progress["eta_seconds"]
    return (f"{_amount(progress['done'])} of {planned:,} {unit} ({progress_percent(progress)}%), "
            f"ETA {'unknown' if eta is None else span(eta)}")


def progress_done(progress: Mapping[str, Any]) -> str:
    """How much a running trial has done: "340 steps", "1.5 epochs"."""
    return f"{_amount(progress['done'])} {progress['unit']}"


def progress_percent(progress: Mapping[str, Any]) -> int:
    """Its planned length done, in whole percent rounded down (0 without a plan)."""
    return math.floor(100 * (progress["fraction"] or 0))


def _amount(done: float) -> str:
    return f"{done:,}" if isinstance(done, int) else f"{done:,.2f}".rstrip("0").rstrip(".")
