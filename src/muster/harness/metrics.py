"""Training and validation metrics: checked on each call, buffered, appended as JSON lines.

One line per report in the rank's metrics file, in the format `muster.metrics_lines` owns
(its `template` makes every line written here; ingestion and verification parse them with
its `parse`).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import chain, groupby, repeat, starmap
from operator import itemgetter
from pathlib import Path

from muster.harness.arguments import check_count
from muster.harness.drill_nan import NanRequest
from muster.harness.heartbeat import Progress
from muster.metrics_lines import exact_template, json_number
from muster.metrics_lines import template as line_template
from muster.states import MetricKind

__all__ = ["MetricsWriter", "to_number"]
TEMPLATE_CACHE_SIZE = 4096
MAX_UNWRITTEN_CHARS = 128 << 20  # beyond it, a write that keeps failing drops the oldest lines
TAIL_SCAN_BYTES = 1 << 16

# (the line's template, step, *metric values, unix time in ns)
_Report = tuple[str | float | int, ...]
_AFTER_TEMPLATE = itemgetter(slice(1, None))

_time_ns = time.time_ns


class MetricsWriter:
    """Appends reported metrics to one rank's metrics.jsonl, without ever tearing a line.

    `report` runs on every training step, so it only checks the step and the metrics, turns
    scalars into numbers and queues them; `flush` (the background thread's, every second,
    and at close) formats the queued reports and writes them as whole lines with write(2),
    no fsync. A kill in the middle of that write can tear only the file's last line, which
    readers skip; a failed write is cut back off the file and retried on the next flush.
    """

    def __init__(self, path: Path, rank: int, nan: NanRequest | None = None) -> None:
        self.path = path
        self._rank = rank
        # A drill's "nan" fault: armed by the background thread, applied by `report`.
        self._nan = nan or NanRequest(None)
        # deque.append and popleft are atomic: the training loop never waits on a lock.
        self._queue: deque[_Report] = deque()
        self._templates: dict[str, dict[tuple[str, ...], str]] = {kind: {} for kind in MetricKind}
        self._unwritten = ""  # lines formatted but not yet written
        self._write_lock = threading.Lock()
        self._fd = _open_for_append(path)
        self._closed = False
        self._last_written: Progress | None = None

    def report(self, kind: MetricKind, step: object, metrics: Mapping[str, object]) -> None:
        """Check and queue one report, stamped with the time now (a progress call).

        Raises:
            TypeError, ValueError: `step`, a metric or its name is not what the format
                allows; the message names the metric (and states the name rule).
            RuntimeError: the harness has ended (after `init()`'s block).
        """
        now = _time_ns()
        if self._closed:
            raise RuntimeError(f"report_{kind}() was called after muster.harness.init() ended")
        if type(step) is not int or step < 0:
            step = check_count(step, f"report_{kind}: step")
        if type(metrics) is not dict:
            metrics = _checked_mapping(metrics)
        if self._nan.armed:
            metrics = self._nan.apply(kind, step, metrics)
        names = tuple(metrics)
        template = self._templates[kind].get(names) or self._template(kind, names)
        for value in metrics.values():
            value_type = type(value)
            if value_type is not float and value_type is not int:
                break
        else:
            # One flat tuple of a string and numbers per report: small for the caches, and
            # the garbage collector soon stops tracking it. The thread formats it later.
            self._queue.append((template, step, *metrics.values(), now))
            return
        if len(names) == 1:  # the usual per-step report: one loss tensor
            self._queue.append((template, step, to_number(names[0], value), now))
        else:
            self._queue.append((template, step, *_numbers(names, metrics.values()), now))

    def flush(self) -> None:
        """Write the queued reports (write + flush, no fsync).

        Raises:
            OSError: the write failed; the lines stay queued for the next flush.
        """
        with self._write_lock:
            # popleft is atomic and reports only ever append on the right: no lock needed.
            reports = list(starmap(self._queue.popleft, repeat((), len(self._queue))))
            if reports:
                self._last_written = _progress(reports[-1])
            text = self._unwritten + _format(reports)
            self._unwritten = ""
            if not text:
                return
            try:
                _append_whole(self._fd, text.encode())
            except OSError:
                self._keep_unwritten(text)
                raise

    @property
    def last(self) -> Progress | None:
        """(time, step) of the latest report: read from the queue, so `report` stays cheap."""
        try:
            return _progress(self._queue[-1])
        except IndexError:  # nothing queued since the last flush
            return self._last_written

    def close(self) -> None:
        """Flush, fsync and close the file; later reports raise RuntimeError."""
        self._closed = True
        try:
            self.flush()
            with self._write_lock:
                os.fsync(self._fd)
        finally:
            with self._write_lock:
                os.close(self._fd)

    def _template(self, kind: str, names: tuple[str, ...]) -> str:
        """Check the names (the first time they are seen) and make their line template, which
        refuses a name that breaks `muster.metrics_lines.NAME_RULE`."""
        for name in names:
            _check_name(name)
        template = line_template(kind, names, self._rank)
        templates = self._templates[kind]
        if len(templates) < TEMPLATE_CACHE_SIZE:
            templates[names] = template
        return template

    def _keep_unwritten(self, text: str) -> None:
        excess = len(text) - MAX_UNWRITTEN_CHARS
        if excess > 0:  # drop whole lines, the oldest first
            text = text[text.index("\n", excess) + 1:]
            warnings.warn(f"muster.harness: {self.path} cannot be written; dropped the "
                          f"oldest {excess:,}+ bytes of metric lines", RuntimeWarning,
                          stacklevel=3)
        self._unwritten = text


def _format(reports: list[_Report]) -> str:
    """The lines of `reports`: one % per run of reports that share a template, in C."""
    chunks = []
    for template, group in groupby(reports, key=itemgetter(0)):
        runs = list(map(_AFTER_TEMPLATE, group))
        arguments = tuple(chain.from_iterable(runs))
        if _all_finite(arguments):
            chunks.append((template * len(runs)) % arguments)
        else:  # %r would write nan or inf: write JSON's tokens instead
            exact = exact_template(template)
            chunks.append("".join([exact % _exact_arguments(one) for one in runs]))
    return "".join(chunks)


def _all_finite(numbers: tuple[float | int, ...]) -> bool:
    """False when a number is NaN or ±inf (or when their sum overflows: a rare false alarm
    that only costs the slower, exact formatting)."""
    try:
        total = sum(numbers)
    except OverflowError:  # an int too large for a float
        return False
    return bool(total - total == 0)


def _progress(report: _Report) -> Progress:
    return int(report[-1]) / 1e9, int(report[1])


def _exact_arguments(arguments: tuple[float | int, ...]) -> tuple[object, ...]:
    step, *values, now = arguments
    return (step, *[json_number(value) for value in values], now)


def _numbers(names: tuple[str, ...], values: Iterable[object]) -> list[float | int]:
    numbers: list[float | int] = []
    for name, value in zip(names, values, strict=True):
        # The usual case first: a float or an int (never a bool) is taken as it is.
        numbers.append(value if type(value) is float or type(value) is int
                       else to_number(name, value))
    return numbers


def _checked_mapping(metrics: object) -> Mapping[str, object]:
    if not isinstance(metrics, Mapping):
        raise TypeError("metrics must be a mapping of metric name to number, "
                        f"got {type(metrics).__name__}")
    return metrics


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(f"metric names must be str, got {type(name).__name__} {name!r}")


def to_number(name: str, value: object) -> float | int:
    """`value` as a plain float or int: numbers, and numpy and torch 0-d scalars.

    Raises:
        TypeError: `value` is not a number, or not a 0-d scalar; the message names `name`.
    """
    ndim = getattr(value, "ndim", None)  # numpy and torch scalars first: the common case
    if ndim is not None and hasattr(value, "item"):
        if ndim != 0:
            shape = tuple(getattr(value, "shape", ()))
            raise TypeError(f"metric {name!r} is a {type(value).__name__} of shape {shape}; "
                            "report a number or a 0-d scalar (e.g. loss.item())")
        # .item() rather than float(): torch warns on float() of a tensor that needs grad.
        item = value.item()
        return item if type(item) is float else to_number(name, item)
    if isinstance(value, bool):
        raise TypeError(f"metric {name!r} is a bool ({value}); report a number such as "
                        f"{int(value)}")
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "__float__") and not isinstance(value, complex):
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"metric {name!r} could not be converted to a float: {exc}") from exc
    raise TypeError(f"metric {name!r} must be a number (int or float), "
                    f"got {type(value).__name__} {_shown(value)}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _open_for_append(path: Path) -> int:
    """Open `path` for appending, first cutting off a torn last line a killed run left."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        whole = _end_of_last_line(fd, size)
        if whole != size:
            os.ftruncate(fd, whole)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _end_of_last_line(fd: int, size: int) -> int:
    """The offset just past the last newline in the file (0 when it has none)."""
    end = size
    while end > 0:
        start = max(0, end - TAIL_SCAN_BYTES)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _append_whole(fd: int, data: bytes) -> None:
    """Append `data` completely, or cut the file back to where it was and raise."""
    start = os.lseek(fd, 0, os.SEEK_END)
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.ftruncate(fd, start)
        raise
