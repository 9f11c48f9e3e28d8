"""Counted nouns and rank lists, worded one way in every message muster writes."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["NOT_VERIFIED", "count", "rank_list"]

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
