"""Waiting for a condition instead of sleeping for a guessed time.

`timeout` is only a bound on how long a broken test hangs, never a measure of speed: a
passing test returns as soon as its condition holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    what: str = "the condition",
    interval: float = 0.02,
) -> T:
    """Call `predicate` until it returns something truthy, and return that value.

    Raises AssertionError naming `what` (and the last value seen) after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {value!r}")
        time.sleep(interval)
