"""(c) The last 500 lines of a big log, against `tail -n 500` on the same file.

Measured three ways on logs of 10 MB, 100 MB and 1 GB: the functions behind the API
(`tail_offset` + `read_range`, what `read_log` does for `?tail=500`), the HTTP endpoint
`GET /trials/{id}/logs?tail=500` of a real server through the SDK, and `tail -n 500` as a
subprocess. Each log belongs to a finished trial of that server; its bytes are written
straight into the trial's log file (how fast the shim writes logs is benchmark (b)). Warm
page cache: the files are fresh and fsynced. Everything is deleted afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from measure import expect, interleave, median, ms
from muster_server import ServerProcess
from report import Outcome, Table, Target

from muster.client import Client
from muster.launch.logs import FileLog, read_range, tail_offset
from muster.services.logs import DEFAULT_LIMIT

LINES = 500
TARGET_MS = 10.0
BLOCK_LINES = 10_000
CONFIG = 'name: bench-tail\nentrypoint: python -c "pass"\n'


def write_log(path: Path, megabytes: int) -> None:
    """`megabytes` MB of 100-byte lines, each numbered by its block and place in it."""
    template = b"".join(b"BBBBBBBB %05d %s\n" % (n, b"z" * 84) for n in range(BLOCK_LINES))
    with path.open("wb") as log:
        for block in range(megabytes):
            log.write(template.replace(b"BBBBBBBB", b"%08d" % block))
        log.flush()
        os.fsync(log.fileno())


def attach_log(client: Client, megabytes: int) -> tuple[int, Path]:
    """Run a trial to its end, then give it a log of `megabytes` MB; (trial id, log path)."""
    experiment = client.create_experiment(CONFIG, None)
    final = client.wait_experiment(int(experiment["id"]), poll=0.05)
    expect(final["state"] == "COMPLETED", f"the tail fixture's trial ended {final['state']}")
    trial = final["trials"][0]
    path = Path(trial["attempts"][0]["replicas"][0]["log_path"])
    write_log(path, megabytes)
    return int(trial["id"]), path


def tail_arms(client: Client, trial_id: int, path: Path) -> dict[str, Callable[[], float]]:
    """The three ways to read the tail of one log, each checked against `tail -n`."""

    def function() -> bytes:
        return read_range(FileLog(0, path), tail_offset(FileLog(0, path), LINES), DEFAULT_LIMIT)[0]

    def http() -> bytes:
        return client.read_logs(trial_id, tail=LINES).data

    def tail_n() -> bytes:
        return subprocess.run(["tail", "-n", str(LINES), str(path)], capture_output=True,
                              check=True).stdout

    expected = tail_n()
    expect(expected.count(b"\n") == LINES, f"tail -n {LINES} of {path} gave too few lines")

    def timed(read: Callable[[], bytes], what: str) -> Callable[[], float]:
        def arm() -> float:
            start = time.perf_counter()
            data = read()
            elapsed = time.perf_counter() - start
            expect(data == expected, f"{what} returned other bytes than `tail -n {LINES}`")
            return elapsed
        return arm

    return {"function": timed(function, "tail_offset + read_range"),
            "http": timed(http, "GET ?tail=500"), "tail -n": timed(tail_n, "tail -n")}


def run(quick: bool) -> Outcome:
    sizes = [10, 100] if quick else [10, 100, 1000]
    repetitions = 10 if quick else 30
    with (tempfile.TemporaryDirectory(prefix="muster-bench-tail-") as tmp,
          ServerProcess(Path(tmp)) as server, server.client() as client):
        arms: dict[str, Callable[[], float]] = {}
        for megabytes in sizes:
            print(f"  writing a {megabytes} MB log", file=sys.stderr, flush=True)
            trial_id, path = attach_log(client, megabytes)
            for method, arm in tail_arms(client, trial_id, path).items():
                arms[f"{method}@{megabytes}"] = arm
        samples = interleave(arms, repetitions)
    return _outcome(sizes, samples)


METHODS = {
    "function": "`tail_offset` + `read_range` (in process)",
    "http": "`GET /trials/{id}/logs?tail=500` (SDK → server)",
    "tail -n": "`tail -n 500` (subprocess)",
}


def _outcome(sizes: list[int], samples: dict[str, list[float]]) -> Outcome:
    def median_ms(method: str, megabytes: int) -> float:
        return ms(median(samples[f"{method}@{megabytes}"]))

    rows = [[label, *(f"{median_ms(method, mb):.2f}" for mb in sizes)]
            for method, label in METHODS.items()]
    table = Table(f"(c) last {LINES} lines of a log (median ms)",
                  ["method", *(f"{mb} MB" for mb in sizes)], rows)
    largest = sizes[-1]
    targets = [
        Target(f"(c) {method} on the {largest} MB log ≤ {TARGET_MS:.0f} ms",
               f"{median_ms(method, largest):.2f} ms", median_ms(method, largest) <= TARGET_MS)
        for method in ("function", "http")
    ]
    flat = median_ms("function", largest) / median_ms("function", sizes[0])
    notes = [f"{len(next(iter(samples.values())))} interleaved repetitions of each cell; "
             f"every answer equalled `tail -n {LINES}`'s bytes.",
             f"function cost on {largest} MB / on {sizes[0]} MB: {flat:.2f} times "
             "(flat: it reads only the tail's blocks)."]
    data = {"samples_s": samples, "sizes_mb": sizes, "flatness": flat}
    return Outcome("tail", [table], targets, notes, data)
