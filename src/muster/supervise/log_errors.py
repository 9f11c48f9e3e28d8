"""What a replica's log says against an exit 0: a Python traceback, a KeyboardInterrupt, a
CUDA or NCCL error (`verify.log_errors`).

A script that catches its own crash (`except Exception: print(...); sys.exit(0)`) or
Ctrl-C exits 0 with the proof in its log. The scan reads at most the last `MAX_SCAN_BYTES`
of each log, in a child process (`python -m muster.supervise.log_errors START`, the log's
bytes from START on its stdin) that limits its own CPU time, as `log_samples` does: a log of
many GiB costs one bounded read, never the supervisor's loop. The child reports where each
finding starts (its log offset) and quotes it; the parent dates each finding by the log's
index, so verification can tell a crash after the last progress (SUSPECT) from one the
script printed and went on from (a warning).
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from muster.launch.log_index import IndexWalker
from muster.launch.logs import ReplicaLog, drops_of, open_log
from muster.supervise.log_samples import (
    IN_PROCESS_BYTES,
    MAX_LINE_BYTES,
    limit_cpu,
    scan_in_child,
)

__all__ = ["MAX_SCAN_BYTES", "Finding", "RankScan", "findings_in", "scan_log"]

MAX_SCAN_BYTES = 64 << 20  # per rank: the log's tail, where an exit 0 is contradicted
QUOTE_CHARS = 300
KEPT_FIRST, KEPT_LAST = 3, 20  # findings named per log; all are counted
DEFAULT_TIMEOUT_S = 60.0

_TRACEBACK = b"Traceback (most recent call last):"
_CHAINED = (b"During handling of the above exception", b"The above exception was the direct")
_DEVICE_ERROR = re.compile(
    rb"CUDA error|CUDA out of memory|CUDA driver error|cudaError[A-Z]\w*|CUBLAS_STATUS_[A-Z_]+"
    rb"|CUDNN_STATUS_[A-Z_]+|device-side assert triggered|illegal memory access"
    rb"|NCCL error|nccl(?:System|Internal|InvalidUsage|UnhandledCuda|Remote)Error"
    rb"|ProcessGroupNCCL\S* .*(?:[Tt]imeout|[Ee]rror)")


@dataclass(frozen=True)
class Finding:
    """One thing in a log that contradicts a clean end."""

    kind: str  # "traceback", "keyboard_interrupt", "device_error"
    offset: int  # where it starts in the log (the traceback's first line)
    text: str  # the exception line, or the error line, cut to QUOTE_CHARS
    time: float | None = None  # when that part of the log arrived (its index); None: unknown


@dataclass(frozen=True)
class RankScan:
    """One rank's log, scanned: the first and last findings, how many in all, and from
    which offset it was read (0 unless the log is longer than `MAX_SCAN_BYTES`)."""

    rank: int
    findings: tuple[Finding, ...] = ()
    total: int = 0
    scanned_from: int = 0
    problem: str | None = None  # the scan itself failed (then nothing was judged)


def findings_in(lines: Iterable[tuple[int, bytes]]) -> tuple[list[Finding], int]:
    """The findings in `lines` ((offset, line) pairs, in order): the first `KEPT_FIRST`
    and last `KEPT_LAST`, and the total count (pure; the child runs it)."""
    first: list[Finding] = []
    last: list[Finding] = []
    total = 0
    traceback_at: int | None = None
    for offset, raw in lines:
        line = raw.rstrip(b"\r\n")
        found: Finding | None = None
        if line.startswith(_TRACEBACK):
            traceback_at = offset
            continue
        if traceback_at is not None:
            if not line or line[:1] in (b" ", b"\t") or line.startswith(_CHAINED):
                continue  # a frame, a blank line, or a chained exception's heading
            found = Finding(_kind_of(line), traceback_at, _quote(line))
            traceback_at = None
        elif line.startswith(b"KeyboardInterrupt"):
            found = Finding("keyboard_interrupt", offset, _quote(line))
        elif _DEVICE_ERROR.search(line):
            found = Finding("device_error", offset, _quote(line))
        if found is None:
            continue
        total += 1
        if len(first) < KEPT_FIRST:
            first.append(found)
        else:
            last = [*last[-(KEPT_LAST - 1):], found]
    return first + last, total


def _kind_of(exception_line: bytes) -> str:
    if exception_line.startswith(b"KeyboardInterrupt"):
        return "keyboard_interrupt"
    if _DEVICE_ERROR.search(exception_line):
        return "device_error"
    return "traceback"


def _quote(line: bytes) -> str:
    text = line.decode("utf-8", errors="replace").strip()
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


def numbered_lines(stream: BinaryIO, start: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of each line of `stream`, whose first byte is at log offset `start`;
    from a `start` inside the log, the first (partial) line is skipped."""
    offset = start
    skip = start > 0
    while line := stream.readline(MAX_LINE_BYTES):
        here, offset = offset, offset + len(line)
        if skip:
            skip = not line.endswith(b"\n")
            continue
        yield here, line


def scan_log(log: ReplicaLog, timeout: float = DEFAULT_TIMEOUT_S) -> RankScan:
    """Scan the last `MAX_SCAN_BYTES` of `log` in a child process killed after `timeout`
    seconds; date each finding by the log's index. A log held to its limit is scanned from
    the end of its last dropped range at most: offsets count on from the scan's start."""
    stream = open_log(log)
    if stream is None:
        return RankScan(log.rank)
    with stream:
        size = stream.seek(0, 2)
        start = max(0, size - MAX_SCAN_BYTES, drops_of(stream).floor(size))
        stream.seek(start)
        if size - start <= IN_PROCESS_BYTES:  # its expressions are muster's: no child
            found, total = findings_in(numbered_lines(io.BytesIO(stream.read(size - start)),
                                                      start))
            return RankScan(log.rank, tuple(_dated(log, found)), total, start)
        answer = scan_in_child(__name__, [str(start)], stream, timeout, MAX_SCAN_BYTES)
    if answer.problem is not None:
        return RankScan(log.rank, scanned_from=start, problem=f"scanning the log {answer.problem}")
    data = json.loads(answer.out)
    findings = [Finding(f["kind"], int(f["offset"]), str(f["text"])) for f in data["findings"]]
    return RankScan(log.rank, tuple(_dated(log, findings)), int(data["total"]), start)


def _dated(log: ReplicaLog, findings: list[Finding]) -> list[Finding]:
    """Each finding with the time its part of the log arrived (offsets are increasing)."""
    if not findings:
        return []
    walker = IndexWalker(log, findings[0].offset)
    try:
        return [Finding(f.kind, f.offset, f.text, walker.time_at(f.offset) or None)
                for f in findings]
    finally:
        walker.close()


def main(argv: list[str]) -> int:
    """`python -m muster.supervise.log_errors START CPU_SECONDS` < the log from START:
    prints the findings as JSON; the kernel stops it after CPU_SECONDS of CPU time."""
    (start,) = limit_cpu(argv)
    findings, total = findings_in(numbered_lines(sys.stdin.buffer, int(start)))
    json.dump({"findings": [{"kind": f.kind, "offset": f.offset, "text": f.text}
                            for f in findings], "total": total}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
