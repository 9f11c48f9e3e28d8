"""Sample counts read from a replica's log, for scripts that do not use the harness
(`verify.samples_from_log`): a regular expression with a named group `samples` and,
optionally, `epoch`.

Each line of the log is searched (a line longer than `MAX_LINE_BYTES` is cut there). With an
`epoch` group, the samples of every match add up in that epoch; without one, each match is
the next epoch (0, 1, 2, ...). The pattern is the experiment owner's and the log may be many
GiB, so the search never runs in the server: a child process (`python -m
muster.supervise.log_samples PATTERN`) reads the log from its stdin, fed through the
launcher's log interface, and is killed after `timeout` seconds (a pattern that backtracks
catastrophically costs one verification, not the supervisor). The child also limits its own
CPU time (RLIMIT_CPU), so it ends even if the server that started it died meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, BinaryIO

from muster.launch.logs import MAX_OFFSET, ReplicaLog, open_log

__all__ = ["MAX_LINE_BYTES", "ChildAnswer", "LogSamples", "bounded_lines", "count_log_samples",
           "counts_in", "limit_cpu", "scan_in_child"]

MAX_LINE_BYTES = 64 * 1024
FEED_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 60.0
_WHOLE = re.compile(r"\s*[0-9]{1,18}\s*")


@dataclass(frozen=True)
class LogSamples:
    """Samples per epoch found in one log, or why none could be counted."""

    by_epoch: dict[int, int]
    matches: int
    problem: str | None = None
    unusable: int = 0  # matches whose groups were not whole numbers ≥ 0


def counts_in(lines: Iterator[bytes], pattern: re.Pattern[str]) -> LogSamples:
    """The samples per epoch that `pattern` finds in `lines` (pure; the child runs it)."""
    by_epoch: dict[int, int] = {}
    matches = unusable = 0
    epoch_group = "epoch" in pattern.groupindex
    for line in lines:
        found = pattern.search(line[:MAX_LINE_BYTES].decode("utf-8", errors="replace"))
        if found is None:
            continue
        samples = _whole(found["samples"])
        epoch = _whole(found["epoch"]) if epoch_group else matches
        if samples is None or epoch is None:
            unusable += 1  # counted, and shown in the check's detail
            continue
        by_epoch[epoch] = by_epoch.get(epoch, 0) + samples
        matches += 1
    return LogSamples(by_epoch, matches, unusable=unusable)


def _whole(text: str | None) -> int | None:
    """`text` as a whole number ≥ 0 (ASCII digits, at most 18 of them), or None."""
    if text is None or not _WHOLE.fullmatch(text):
        return None
    return int(text)


def bounded_lines(stream: BinaryIO) -> Iterator[bytes]:
    """The lines of `stream`, none longer than `MAX_LINE_BYTES` (a longer one comes in
    pieces): memory stays bounded whatever the log holds."""
    while line := stream.readline(MAX_LINE_BYTES):
        yield line


def count_log_samples(log: ReplicaLog, pattern: str,
                      timeout: float = DEFAULT_TIMEOUT_S) -> LogSamples:
    """The samples per epoch `pattern` finds in `log`, counted by a child process that is
    killed after `timeout` seconds (then `problem` says so)."""
    stream = open_log(log)  # without the ranges dropped to hold it to its limit
    if stream is None:
        return LogSamples({}, 0)
    with stream:
        answer = scan_in_child(__name__, [pattern], stream, timeout)
    if answer.problem is not None:
        return LogSamples({}, 0, f"counting {answer.problem}")
    data = json.loads(answer.out)
    return LogSamples({int(k): int(v) for k, v in data["by_epoch"].items()}, data["matches"],
                      unusable=data["unusable"])


@dataclass(frozen=True)
class ChildAnswer:
    """What a scanning child printed, or why it printed nothing usable."""

    out: bytes = b""
    problem: str | None = None  # e.g. "took longer than 60 s (does the pattern backtrack?)"


# A log part this small is read in the server itself when only muster's own expressions
# look at it (no pattern of the user's): a child's start-up would cost more than the read.
IN_PROCESS_BYTES = 256 * 1024


def scan_in_child(module: str, args: Sequence[str], stream: BinaryIO, timeout: float,
                  limit: int | None = None) -> ChildAnswer:
    """Run `python -m module *args CPU_SECONDS` with `stream` (from where it stands, at
    most `limit` bytes) on its stdin; kill it after `timeout` seconds. The child's `main`
    calls `limit_cpu(CPU_SECONDS)` first, so it ends even if this process dies."""
    cpu_limit = str(math.ceil(timeout) + 5)
    child = subprocess.Popen([sys.executable, "-P", "-m", module, *args, cpu_limit],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    # The feeder owns stdin; `communicate` reads the answer (and must not touch stdin).
    pipe, child.stdin = child.stdin, None
    assert pipe is not None
    feeder = threading.Thread(target=_feed, args=(stream, pipe, limit), daemon=True)
    feeder.start()
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return ChildAnswer(problem=f"took longer than {timeout:g} s (does the pattern "
                                   "backtrack?)")
    except BaseException:
        child.kill()  # interrupted: the scan is abandoned, so is its child
        child.wait()
        raise
    finally:
        feeder.join(timeout=5)
    if child.returncode != 0:
        why = err.decode("utf-8", errors="replace").strip().splitlines()[-1:] or ["?"]
        return ChildAnswer(problem=f"failed: {why[0]}")
    return ChildAnswer(out)


def limit_cpu(argv: list[str]) -> list[str]:
    """A scanning child's arguments without the last, CPU_SECONDS, which it applies as its
    RLIMIT_CPU (the kernel stops it after that much CPU time)."""
    seconds = int(argv[-1])
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
    return argv[:-1]


def _feed(stream: BinaryIO, pipe: IO[bytes], limit: int | None = None) -> None:
    """Copy the log (at most `limit` bytes) into the child's stdin; a child that has gone
    stops the copy."""
    left = MAX_OFFSET if limit is None else limit
    try:
        while left > 0 and (chunk := stream.read(min(FEED_BYTES, left))):
            pipe.write(chunk)
            left -= len(chunk)
    except OSError:
        return  # the child ended (or was killed on its timeout): nothing more to feed
    finally:
        with contextlib.suppress(OSError):  # (the child is gone: closing cannot fail it)
            pipe.close()


def main(argv: list[str]) -> int:
    """`python -m muster.supervise.log_samples PATTERN [CPU_SECONDS]` < log: prints the
    counts as JSON; the kernel stops it after CPU_SECONDS of CPU time."""
    if len(argv) > 1:
        argv = limit_cpu(argv)
    pattern = re.compile(argv[0])
    counts = counts_in(bounded_lines(sys.stdin.buffer), pattern)
    json.dump({"by_epoch": counts.by_epoch, "matches": counts.matches,
               "unusable": counts.unusable}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
