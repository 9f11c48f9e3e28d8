"""Durations and sizes as people write them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from muster.config import parse_duration, parse_size


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30s", 30.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        ("1m30s", 90.0),
        ("1h0m5s250ms", 3605.25),
        ("1.5h", 5400.0),
        (" 10s ", 10.0),
        ("0s", 0.0),
        ("45", 45.0),
        ("2.5", 2.5),
        (30, 30.0),
        (2.5, 2.5),
        (0, 0.0),
    ],
)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        "soon",
        "",
        "   ",
        "-5s",
        "30 s",
        "٣s",
        "30m1h",
        "1h1h",
        "5x",
        "1.s",
        "ms",
        -1,
        -0.5,
        math.inf,
        math.nan,
        10**400,
        "9" * 400 + "h",
        True,
        None,
        [30],
    ],
)
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(ValueError, match=r"must "):
        parse_duration(value)


def test_parse_duration_message_names_the_key_when_given() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration("soon", name="stop_grace")
    assert str(info.value).startswith("stop_grace must look like '30s'")
    assert "got 'soon'" in str(info.value)


def test_parse_duration_message_without_name_reads_after_a_key_path() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration("soon")
    assert str(info.value).startswith("must look like '30s'")


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("4GiB", 4 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1.5GiB", 3 * 2**29),
        ("1KiB", 1024),
        ("1kb", 1000),
        ("2 TiB", 2 * 2**40),
        ("1PB", 10**15),
        ("100B", 100),
        ("100", 100),
        ("0", 0),
        ("1.1GB", 1_100_000_000),
        (4096, 4096),
        (0, 0),
        (2048.0, 2048),
    ],
)
def test_parse_size_accepts(value: object, size: int) -> None:
    result = parse_size(value)
    assert result == size
    assert isinstance(result, int)


@pytest.mark.parametrize(
    "value",
    ["4 gigs", "4G", "GiB", "", "-1GiB", "1.5B", "0.3KiB", "4GiBs", -1, 1.5, True, None, math.inf],
)
def test_parse_size_rejects(value: object) -> None:
    with pytest.raises(ValueError, match=r"must "):
        parse_size(value)


def test_parse_size_message_matches_the_style_guide() -> None:
    with pytest.raises(ValueError) as info:
        parse_size("4 gigs", name="memory_limit")
    assert str(info.value).startswith("memory_limit must look like '4GiB'")
    assert str(info.value).endswith("got '4 gigs'")


@given(hours=st.integers(0, 99), minutes=st.integers(0, 59), seconds=st.integers(0, 59))
def test_parse_duration_adds_up_its_parts(hours: int, minutes: int, seconds: int) -> None:
    text = f"{hours}h{minutes}m{seconds}s"
    assert parse_duration(text) == hours * 3600 + minutes * 60 + seconds


@given(st.text(max_size=20))
def test_parse_duration_returns_seconds_or_raises_value_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except ValueError:
        return
    assert math.isfinite(seconds)
    assert seconds >= 0


@given(st.integers(min_value=0, max_value=2**20), st.sampled_from(["KiB", "MiB", "GiB"]))
def test_parse_size_binary_units(number: int, unit: str) -> None:
    power = {"KiB": 10, "MiB": 20, "GiB": 30}[unit]
    assert parse_size(f"{number}{unit}") == number * 2**power
