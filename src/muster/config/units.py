"""Durations and sizes as people write them in configs: "1h30m", "500ms", "4GiB".

Both parsers raise `ValueError` with a message that says what the value must look like.
Without `name` the message starts with "must ..." so a caller can put a key path in front
(`failure_policy.stop_grace: must look like ...`); with `name` it reads on its own.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

__all__ = ["format_duration", "parse_duration", "parse_size"]

_NUMBER = r"\d+(?:\.\d+)?"
# Units in descending order, each at most once: "1h30m" is clear, "30m1h" is a typo.
_DURATION = re.compile(
    rf"(?:(?P<d>{_NUMBER})d)?"
    rf"(?:(?P<h>{_NUMBER})h)?"
    rf"(?:(?P<m>{_NUMBER})m(?!s))?"
    rf"(?:(?P<s>{_NUMBER})s)?"
    rf"(?:(?P<ms>{_NUMBER})ms)?",
    re.ASCII,
)
_SECONDS_PER_UNIT = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

_SIZE = re.compile(rf"(?P<number>{_NUMBER})\s*(?P<unit>[a-z]*)", re.IGNORECASE | re.ASCII)
_BYTES_PER_UNIT = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}


def parse_duration(value: object, name: str | None = None) -> float:
    """Seconds from a number of seconds or a string like "30s", "500ms", "5m", "1h30m", "2d".

    Raises:
        ValueError: the value is not a non-negative duration.
    """
    seconds = _duration_seconds(value)
    if seconds is not None:
        return _non_negative_seconds(seconds, value, name)
    raise ValueError(
        f"{_subject(name)}must look like '30s', '500ms', '5m' or '1h30m' "
        f"(or a number of seconds), got {value!r}"
    )


def format_duration(seconds: float) -> str:
    """A duration as a config would say it, and `parse_duration` reads it back: "90d",
    "1h30m", "2s", "1.5s", "0s" (seconds to the millisecond).

    Raises:
        ValueError: `seconds` is negative or not finite.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration is a number of seconds >= 0, got {seconds!r}")
    parts = []
    rest = seconds
    for unit in ("d", "h", "m"):
        count = int(rest // _SECONDS_PER_UNIT[unit])
        if count:
            parts.append(f"{count}{unit}")
            rest -= count * _SECONDS_PER_UNIT[unit]
    rest = round(rest, 3)
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return "".join(parts)


def parse_size(value: object, name: str | None = None) -> int:
    """Bytes from a whole number of bytes or a string like "4GiB", "512MiB", "1.5GB".

    KiB/MiB/GiB/TiB/PiB are powers of 1024, KB/MB/GB/TB/PB powers of 1000; case is ignored.

    Raises:
        ValueError: the value is not a non-negative whole number of bytes.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value >= 0 and (isinstance(value, int) or value.is_integer()):
            return int(value)
        raise ValueError(f"{_subject(name)}must be a whole number of bytes >= 0, got {value!r}")
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        multiplier = _BYTES_PER_UNIT.get(match["unit"].lower()) if match else None
        if match and multiplier is not None:
            return _whole_bytes(match["number"], multiplier, value, name)
    raise ValueError(f"{_subject(name)}must look like '4GiB', '512MiB' or '1.5GB', got {value!r}")


def _duration_seconds(value: object) -> float | None:
    """Seconds, possibly negative or infinite, or None when `value` is not a duration."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an int beyond any float: no sensible duration either
            return math.inf
    if not isinstance(value, str):
        return None
    text = value.strip()
    if re.fullmatch(_NUMBER, text, re.ASCII):
        return float(text)
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        return None
    return sum(float(n) * _SECONDS_PER_UNIT[u] for u, n in match.groupdict().items() if n)


def _non_negative_seconds(seconds: float, value: object, name: str | None) -> float:
    if math.isfinite(seconds) and seconds >= 0:
        return seconds
    raise ValueError(f"{_subject(name)}must be a number of seconds >= 0, got {value!r}")


def _whole_bytes(number: str, multiplier: int, value: str, name: str | None) -> int:
    size = Decimal(number) * multiplier  # Decimal, not float: "1.1GB" is exactly 1_100_000_000
    if size == size.to_integral_value():
        return int(size)
    raise ValueError(f"{_subject(name)}must be a whole number of bytes, got {value!r}")


def _subject(name: str | None) -> str:
    return f"{name} " if name else ""
