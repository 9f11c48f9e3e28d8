"""Side-by-side timing: every arm runs once per repetition, in a rotating order.

The machine these run on is shared and noisy, so no number is meaningful alone: each
benchmark runs muster and its baseline in the same repetitions, interleaved, and compares
their medians.
"""

from __future__ import annotations

import hashlib
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from report import REPO

HASH_CHUNK_BYTES = 8 << 20


class BenchmarkFailure(RuntimeError):
    """A benchmark saw muster misbehave (lost bytes, a failed run): its numbers mean nothing."""


def expect(condition: bool, message: str) -> None:
    """Stop the benchmark with `message` unless `condition` holds (survives `python -O`)."""
    if not condition:
        raise BenchmarkFailure(message)


def interleave(arms: dict[str, Callable[[], Any]], repetitions: int) -> dict[str, list[Any]]:
    """Run each arm `repetitions` times, all arms once per repetition, rotating who goes first.

    Rotation keeps a slow phase of the machine (another tenant's job, page-cache writeback)
    from always landing on the same arm.
    """
    names = list(arms)
    results: dict[str, list[Any]] = {name: [] for name in names}
    for repetition in range(repetitions):
        shift = repetition % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(arms[name]())
    return results


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> float:
    return seconds * 1000.0


def wait_for_file(path: Path, timeout: float, interval: float = 0.002) -> None:
    """Return as soon as `path` exists; fail after `timeout` seconds (a bound, not a measure)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        expect(time.monotonic() < deadline, f"{path} did not appear within {timeout:.0f} s")
        time.sleep(interval)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def children_cpu() -> float:
    """User + system CPU seconds of this process's reaped children: around one command run
    at a time, the difference is that command's (a server child is reaped only at the end)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def exported_src(commit: str, root: Path) -> str:
    """`src/` of `commit`, exported from git under `root/before`: its path, for `PYTHONPATH`."""
    target = root / "before"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return str(target / "src")
