"""Checks of the numbers training code hands the harness, with messages that name them."""

from __future__ import annotations

import operator
from typing import SupportsIndex


def check_count(value: object, what: str) -> int:
    """`value` as a plain int ≥ 0: an int, or an integer scalar with `__index__`, not a bool.

    Raises:
        TypeError: `value` is not an integer.
        ValueError: `value` is negative.
    """
    number = value if type(value) is int else _as_index(value, what)
    if number < 0:
        raise ValueError(f"{what} must be ≥ 0, got {number}")
    return number


def _as_index(value: object, what: str) -> int:
    if isinstance(value, SupportsIndex) and not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:  # e.g. a float tensor, whose __index__ refuses
            pass
    raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
