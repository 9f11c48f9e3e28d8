"""Counted nouns and rank lists as every message writes them."""

from __future__ import annotations

import pytest

from muster.words import count, rank_list


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
