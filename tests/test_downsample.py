"""Min/max (M4) buckets of a metric's curve: bounded however long it grows, spikes kept,
exact while small, and a resumed attempt's steps replacing what it redid."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from muster.downsample import (
    COARSE_BUCKETS,
    COARSE_POINTS,
    MAX_BUCKETS,
    MAX_POINTS,
    Series,
    points_of,
    stored_last,
    stored_points,
)


def test_a_short_series_is_kept_exactly() -> None:
    series = Series()
    for step in range(100):
        series.add(step, step / 10)
    assert series.points() == (list(range(100)), [step / 10 for step in range(100)])


def test_a_long_series_stays_within_its_buckets_and_keeps_its_spikes() -> None:
    series = Series()
    rng = random.Random(7)
    for step in range(0, 200_000, 2):
        series.add(step, 1.0 + rng.random() / 100)
        if step == 102_468:
            series.add(step + 1, 50.0)  # one spike up ...
        if step == 155_554:
            series.add(step + 1, -50.0)  # ... and one down
    assert len(series.buckets) <= MAX_BUCKETS
    assert series.count == 100_002
    steps, values = series.points()
    assert len(steps) <= MAX_POINTS
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[0] == 0 and steps[-1] == 199_998
    assert (102_469, 50.0) in zip(steps, values, strict=True)
    assert (155_555, -50.0) in zip(steps, values, strict=True)


def test_fewer_points_are_asked_for() -> None:
    series = Series()
    for step in range(10_000):
        series.add(step, math.sin(step / 100))
    for limit in (4, 5, 37, 100, 999):
        steps, values = series.points(limit)
        assert 0 < len(steps) <= limit
        assert steps[0] == 0 and steps[-1] == 9_999
        assert max(values) > 0.99 and min(values) < -0.99  # the extremes survive


def test_a_resumed_attempt_replaces_the_steps_it_redid() -> None:
    series = Series()
    for step in range(10):
        series.add(step, 1.0)
    for step in range(6, 12):  # resumed from the checkpoint at step 5
        series.add(step, 2.0)
    steps, values = series.points()
    assert steps == list(range(12))
    assert values == [1.0] * 6 + [2.0] * 6


def test_a_stored_series_reads_back_and_a_damaged_one_is_empty() -> None:
    series = Series()
    for step in range(1_000):
        series.add(step * 3, step * 0.5)
    again = Series.from_json(series.to_json())
    assert again.points() == series.points() and again.width == series.width
    assert Series.from_json(None).points() == ([], [])
    assert Series.from_json({"width": 4}).points() == ([], [])


@given(st.lists(st.tuples(st.integers(-10**6, 10**6),
                          st.floats(-1e6, 1e6, allow_nan=False)), max_size=3_000),
       st.integers(4, 2_000))
def test_any_reports_give_a_bounded_ordered_curve_of_their_own_points(
        reports: list[tuple[int, float]], limit: int) -> None:
    series = Series()
    for step, value in reports:
        series.add(step, value)
    steps, values = series.points(limit)
    assert len(steps) <= min(limit, MAX_POINTS)
    assert steps == sorted(set(steps))
    assert set(zip(steps, values, strict=True)) <= set(reports)
    if reports:  # the last report is always the curve's end
        assert (steps[-1], values[-1]) == reports[-1]
    assert points_of(series.buckets, limit) == (steps, values)


@given(st.lists(st.tuples(st.integers(-50, 3_000),
                          st.floats(-1e6, 1e6, allow_nan=False)), max_size=3_000),
       st.integers(1, 400))
def test_extending_in_batches_is_adding_one_by_one(reports: list[tuple[int, float]],
                                                    batch: int) -> None:
    one_by_one, batched = Series(), Series()
    for step, value in reports:
        one_by_one.add(step, value)
    for start in range(0, len(reports), batch):
        batched.extend(reports[start:start + batch])
    assert batched.to_json() == one_by_one.to_json()


@given(st.lists(st.tuples(st.integers(0, 5_000),
                          st.floats(-1e6, 1e6, allow_nan=False)), max_size=3_000),
       st.integers(4, 1_200))
def test_points_of_a_stored_series_are_its_points(reports: list[tuple[int, float]],
                                                 limit: int) -> None:
    series = Series()
    series.extend(reports)
    assert stored_points(series.to_json(), limit) == series.points(limit)


@given(st.lists(st.tuples(st.integers(0, 5_000),
                          st.floats(-1e6, 1e6, allow_nan=False)), max_size=3_000))
def test_the_last_point_of_a_stored_series_is_its_last_point(
        reports: list[tuple[int, float]]) -> None:
    series = Series()
    series.extend(reports)
    steps, values = series.points(MAX_POINTS)
    assert stored_last(series.to_json()) == ((steps[-1], values[-1]) if steps else None)


def test_a_coarse_copy_keeps_the_count_the_ends_and_the_extremes() -> None:
    series = Series()
    points = [(step, math.sin(step / 50) + (3.0 if step == 4321 else 0.0))
              for step in range(10_000)]
    series.extend(points)
    coarse = series.coarse()
    assert len(coarse["buckets"]) <= COARSE_BUCKETS < len(series.buckets)
    copy = Series.from_json(coarse)
    assert copy.count == series.count == 10_000
    steps, values = copy.points(COARSE_POINTS)
    assert (steps[0], steps[-1]) == (0, 9999)
    assert max(values) == max(v for _, v in points) and 4321 in steps
    assert min(values) == min(v for _, v in points)
    short = Series()
    short.extend(points[:10])
    assert short.coarse() == short.to_json()  # a series of few buckets is its own copy
