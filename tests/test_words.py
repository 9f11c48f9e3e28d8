"""Counted nouns, rank lists, spans and progress as every message writes them."""

from __future__ import annotations

from typing import Any

import pytest

from muster.words import count, progress_line, rank_list, span


@pytest.mark.parametrize(("number", "noun", "text"), [
    (1, "slot", "1 slot"), (0, "slot", "0 slots"), (3, "retry", "3 retries"),
    (2, "day", "2 days"), (1797, "sample", "1,797 samples"), (1, "retry", "1 retry"),
    (4, "epoch", "4 epochs"),
])
def test_count(number: int, noun: str, text: str) -> None:
    assert count(number, noun) == text


def test_count_with_its_own_plural() -> None:
    assert (count(3, "match", "matches"), count(1, "match", "matches")) == (
        "3 matches", "1 match")


@pytest.mark.parametrize(("numbers", "text"), [
    ([1], "rank 1"), ([0, 1], "ranks 0 and 1"), ([0, 2, 5], "ranks 0, 2 and 5"),
])
def test_rank_list(numbers: list[int], text: str) -> None:
    assert rank_list(numbers) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.9, "0s"), (45, "45s"), (125.7, "2m 05s"), (3599, "59m 59s"),
    (11040, "3h 04m"), (190800, "2d 5h"), (-3, "0s"),
])
def test_span(seconds: float, text: str) -> None:
    assert span(seconds) == text


PLANNED = {"done": 340, "planned": 1000, "unit": "steps", "fraction": 0.3409,
           "eta_seconds": 125.0}


@pytest.mark.parametrize(("progress", "text"), [
    (PLANNED, "340 of 1,000 steps (34%), ETA 2m 05s"),
    (PLANNED | {"eta_seconds": None}, "340 of 1,000 steps (34%), ETA unknown"),
    ({"done": 1.25, "planned": 4, "unit": "epochs", "fraction": 0.3125, "eta_seconds": 3.0},
     "1.25 of 4 epochs (31%), ETA 3s"),
    (PLANNED | {"planned": None, "fraction": None, "eta_seconds": None},
     "340 steps, no planned length"),
    (None, "-"),
])
def test_progress_line(progress: dict[str, Any] | None, text: str) -> None:
    assert progress_line(progress) == text
