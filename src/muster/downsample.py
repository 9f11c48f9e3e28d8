"""A metric's curve kept small as it grows: min/max buckets (M4), built one report at a time.

A chart a few hundred pixels wide shows at most a few points per pixel column, so a series
of any length is kept as at most `MAX_BUCKETS` buckets of consecutive points, and each
bucket is drawn by its first, lowest, highest and last point (M4: Jugel et al., "M4: A
Visualization-Oriented Time Series Data Aggregation", VLDB 2014) -- the picture of the
whole series, spikes included, in at most `4 * MAX_BUCKETS` points. Buckets are made as
reports arrive (`Series.add`): a bucket takes `width` points, and when there are too many
buckets, neighbours merge in pairs and `width` doubles, so the work per report is constant
on average and the series never has to be read again.

A resumed attempt reports steps again from its checkpoint: a step at or before the last one
kept ends the series there (`Series.add` drops the buckets from that step on), so the curve
shows the run that continued, as the search does.

Pure: no store, no I/O. The store keeps a `Series` as `Series.to_json()` (see
`muster.store.series`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, TypedDict

__all__ = ["COARSE_BUCKETS", "COARSE_POINTS", "MAX_BUCKETS", "MAX_POINTS", "Bucket", "Series",
           "SeriesJson", "points_of", "stored_last", "stored_points"]

MAX_BUCKETS = 250  # kept per series
MAX_POINTS = 4 * MAX_BUCKETS  # what `Series.points` gives at most: 1,000
# A series' coarse copy (`Series.coarse`): what a chart of many curves at a few points each
# reads instead of the whole one (an experiment's learning curves of hundreds of trials).
COARSE_BUCKETS = 32
COARSE_POINTS = 4 * COARSE_BUCKETS
_value = itemgetter(1)


@dataclass(slots=True)
class Bucket:
    """Consecutive points: how many, and the first, lowest, highest and last of them."""

    n: int
    first: tuple[int, float]
    low: tuple[int, float]
    high: tuple[int, float]
    last: tuple[int, float]

    @classmethod
    def of(cls, step: int, value: float) -> Bucket:
        point = (step, value)
        return cls(1, point, point, point, point)

    @classmethod
    def over(cls, points: Sequence[tuple[int, float]]) -> Bucket:
        """The bucket of `points` (at least one, steps rising)."""
        return cls(len(points), points[0], min(points, key=_value),
                   max(points, key=_value), points[-1])

    def take(self, other: Bucket) -> None:
        """This bucket followed by `other` (its points come after this one's)."""
        self.n += other.n
        self.last = other.last
        if other.low[1] < self.low[1]:
            self.low = other.low
        if other.high[1] > self.high[1]:
            self.high = other.high

    def points(self) -> list[tuple[int, float]]:
        """Its first, lowest, highest and last points by step, each once."""
        seen = {self.first[0]: self.first, self.low[0]: self.low, self.high[0]: self.high,
                self.last[0]: self.last}
        return [seen[step] for step in sorted(seen)]

    def to_json(self) -> list[int | float]:
        """`[n, first step, first value, low step, low value, high step, high value, last
        step, last value]`."""
        return [self.n, *self.first, *self.low, *self.high, *self.last]

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> Bucket:
        n, *flat = row
        pairs = [(int(flat[i]), float(flat[i + 1])) for i in range(0, 8, 2)]
        return cls(int(n), *pairs)


class SeriesJson(TypedDict):
    """A `Series` as the store keeps it (`MetricSeries.curve`)."""

    width: int
    buckets: list[list[int | float]]  # each `Bucket.to_json()`


@dataclass
class Series:
    """One metric's finite values by step, in buckets of `width` points (see the module)."""

    width: int = 1
    buckets: list[Bucket] = field(default_factory=list)

    def add(self, step: int, value: float) -> None:
        """One report (finite `value`; NaN and ±inf are no point). A step at or before the
        last one kept first drops what was kept from that step on."""
        if self.buckets and step <= self.buckets[-1].last[0]:
            self._cut(step)
        if self.buckets and self.buckets[-1].n < self.width:
            self.buckets[-1].take(Bucket.of(step, value))
            return
        self.buckets.append(Bucket.of(step, value))
        if len(self.buckets) > MAX_BUCKETS:
            self.buckets = _merged(self.buckets, 2)
            self.width *= 2

    def extend(self, points: Sequence[tuple[int, float]]) -> None:
        """`add` each of `points` in turn, a bucket's worth at a time: the same series as
        adding them one by one, at a fraction of the cost (a bucket of a run of rising steps
        is made by `min` and `max` over its slice)."""
        if not points:
            return
        # Where steps stop rising: each such point starts a new run (and may cut).
        falls = [i for i in range(1, len(points)) if points[i][0] <= points[i - 1][0]]
        falls.append(len(points))
        start, fall = 0, 0
        while start < len(points):
            while falls[fall] <= start:
                fall += 1
            step = points[start][0]
            if self.buckets and step <= self.buckets[-1].last[0]:
                self._cut(step)
            last = self.buckets[-1] if self.buckets else None
            if last is not None and last.n < self.width:
                end = min(falls[fall], start + self.width - last.n)
                last.take(Bucket.over(points[start:end]))
            else:
                end = min(falls[fall], start + self.width)
                self.buckets.append(Bucket.over(points[start:end]))
                if len(self.buckets) > MAX_BUCKETS:
                    self.buckets = _merged(self.buckets, 2)
                    self.width *= 2
            start = end

    def _cut(self, step: int) -> None:
        """Drop the buckets that hold `step` or a later one (a bucket is kept whole or not
        at all: the few points before `step` in its bucket go with it)."""
        while self.buckets and self.buckets[-1].last[0] >= step:
            self.buckets.pop()

    def points(self, limit: int = MAX_POINTS) -> tuple[list[int], list[float]]:
        """The curve as (steps, values), at most `limit` (≥ 4) points: each bucket's M4
        points, after merging neighbouring buckets until they fit."""
        return points_of(self.buckets, limit)

    @property
    def count(self) -> int:
        return sum(b.n for b in self.buckets)

    def to_json(self) -> SeriesJson:
        return SeriesJson(width=self.width, buckets=[b.to_json() for b in self.buckets])

    def coarse(self) -> SeriesJson:
        """The series in at most `COARSE_BUCKETS` buckets, as the store keeps it: neighbours
        merged as `points` merges them, so drawing it at `COARSE_POINTS` points or fewer
        draws the same ranges of reports as the whole series would in as many."""
        group = max(1, math.ceil(len(self.buckets) / COARSE_BUCKETS))
        buckets = _merged(self.buckets, group) if group > 1 else self.buckets
        return SeriesJson(width=self.width * group, buckets=[b.to_json() for b in buckets])

    @classmethod
    def from_json(cls, data: Any) -> Series:
        """A stored series; anything else (a row from before, a damaged one) is empty."""
        if not isinstance(data, dict) or not isinstance(data.get("buckets"), list):
            return cls()
        return cls(max(1, int(data.get("width") or 1)),
                   [Bucket.from_json(row) for row in data["buckets"]])


def points_of(buckets: Sequence[Bucket], limit: int) -> tuple[list[int], list[float]]:
    """`buckets` drawn in at most `limit` (≥ 4) points (see `Series.points`)."""
    group = max(1, math.ceil(len(buckets) / max(1, limit // 4)))
    steps: list[int] = []
    values: list[float] = []
    for bucket in _merged(buckets, group) if group > 1 else buckets:
        for step, value in bucket.points():
            steps.append(step)
            values.append(value)
    return steps, values


def stored_points(data: Any, limit: int) -> tuple[list[int], list[float]]:
    """`Series.from_json(data).points(limit)` without making a `Bucket` of each stored one:
    what drawing many stored curves at a few points each costs (an experiment's learning
    curves)."""
    rows = data.get("buckets") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        return [], []
    group = max(1, math.ceil(len(rows) / max(1, limit // 4)))
    if group == 1:
        return Series.from_json(data).points(limit)
    steps: list[int] = []
    values: list[float] = []
    for start in range(0, len(rows), group):
        part = rows[start:start + group]
        low, high = min(part, key=_stored_low), max(part, key=_stored_high)
        seen = {part[0][1]: part[0][2], low[3]: low[4], high[5]: high[6],
                part[-1][7]: part[-1][8]}
        for step in sorted(seen):
            steps.append(int(step))
            values.append(float(seen[step]))
    return steps, values


def stored_last(data: Any) -> tuple[int, float] | None:
    """The last point of a stored series (`Series.to_json`), without reading the rest: a
    resource series' latest sample; None for an empty one."""
    rows = data.get("buckets") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    return int(rows[-1][7]), float(rows[-1][8])


_stored_low = itemgetter(4)  # a stored bucket: [n, first step, value, low step, value,
_stored_high = itemgetter(6)  # high step, value, last step, value]


def _merged(buckets: Iterable[Bucket], group: int) -> list[Bucket]:
    """Every `group` neighbours as one bucket (copies: `buckets` are left as they are)."""
    merged: list[Bucket] = []
    for i, bucket in enumerate(buckets):
        if i % group == 0:
            merged.append(Bucket(bucket.n, bucket.first, bucket.low, bucket.high, bucket.last))
        else:
            merged[-1].take(bucket)
    return merged
