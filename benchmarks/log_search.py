"""(n) Searching a 1 GB log on the server, against `grep -c` on the same file.

The log is written once (real bytes, 100-byte lines like a training loop's, a `loss nan`
line in the first MiB and one every 50 MB after it) under /tmp and reused by later runs;
it is hard-linked (or copied) into the log of a finished trial of a real server. Measured
through the HTTP route `GET /trials/{id}/logs/search` with the SDK: the time to the first
match (it lies in the first MiB), and a whole-file scan paged by `next_from` until complete
(text and regex), in MB/s, beside `grep -c -F` and `grep -c -E` as subprocesses. Warm page
cache: each scan is timed after one unmeasured pass.

Alone: `.venv/bin/python benchmarks/log_search.py [--quick]`; `run.py --only log_search`.
"""

from __future__ import annotations

import os
import shutil
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

CACHE = Path(tempfile.gettempdir()) / "muster-bench-log-search"
FIRST_MATCH_TARGET_S = 1.0
NEEDLE, NEEDLE_AT = "loss nan", 500_000  # the first one, in the first MiB
RARE_EVERY = 50 * 1000**2  # then one each 50 MB
REGEX = r"loss (nan|inf)\b"
BLOCK_LINES = 10_000
CONFIG = 'name: bench-log-search\nentrypoint: python -c "pass"\n'


def log_file(megabytes: int) -> Path:
    """A log of `megabytes` MB (1 MB = 10^6 bytes), written once and reused."""
    path = CACHE / f"training-{megabytes}mb.log"
    if path.exists() and path.stat().st_size == megabytes * 1000**2:
        return path
    CACHE.mkdir(exist_ok=True)
    print(f"  writing a {megabytes} MB log to {path}", file=sys.stderr, flush=True)
    partial = path.with_suffix(".partial")
    with partial.open("wb") as log:
        for block in range(megabytes):
            log.write(_block(block))
        log.flush()
        os.fsync(log.fileno())
    partial.rename(path)
    return path


def _block(block: int) -> bytes:
    """1 MB: 10,000 lines of 100 bytes; a `loss nan` line where the layout puts one."""
    lines = []
    for n in range(BLOCK_LINES):
        step = block * BLOCK_LINES + n
        loss = "nan" if _nan_line(block, n) else f"{2.5 / (1 + step / 5e5):.6f}"
        text = (f"step {step:>10} epoch {step // 500_000:>3} loss {loss} lr 3.0e-04 "
                f"grad_norm {1 + (step % 97) / 100:.3f} tok/s {40_000 + step % 997}")
        lines.append(text[:99].ljust(99).encode() + b"\n")
    return b"".join(lines)


def _nan_line(block: int, n: int) -> bool:
    offset = (block * BLOCK_LINES + n) * 100
    return offset == NEEDLE_AT or (offset > NEEDLE_AT and offset % RARE_EVERY == 0)


def attach(client: Client, source: Path) -> int:
    """Run a trial to its end, then make `source` its log; the trial's id."""
    experiment = client.create_experiment(CONFIG, None)
    final = client.wait_experiment(int(experiment["id"]), poll=0.05)
    expect(final["state"] == "COMPLETED", f"the fixture's trial ended {final['state']}")
    trial = final["trials"][0]
    path = Path(trial["attempts"][0]["replicas"][0]["log_path"])
    path.unlink()
    try:
        os.link(source, path)
    except OSError:
        shutil.copyfile(source, path)
    return int(trial["id"])


def whole_scan(client: Client, trial_id: int, pattern: str, regex: bool) -> int:
    """Every match of `pattern`, paged until complete; how many."""
    found, start = 0, None
    while True:
        page = client.search_logs(trial_id, pattern, regex=regex, start=start, limit=1000)
        found += len(page["matches"])
        if page["complete"]:
            return found
        start = page["next_from"]


def grep_count(path: Path, pattern: str, regex: bool) -> int:
    done = subprocess.run(["grep", "-c", "-E" if regex else "-F", pattern, str(path)],
                          capture_output=True, text=True, check=False)
    expect(done.returncode in (0, 1), f"grep failed: {done.stderr}")
    return int(done.stdout)


def arms(client: Client, trial_id: int, path: Path) -> dict[str, Callable[[], float]]:
    expected = grep_count(path, NEEDLE, regex=False)
    expect(expected >= 2, f"the log holds {expected} '{NEEDLE}' lines, not the layout's")

    def first() -> int:
        page = client.search_logs(trial_id, NEEDLE, limit=1)
        at = page["matches"][0]["offset"]
        expect(NEEDLE_AT < at < NEEDLE_AT + 100, f"the first match is at {at}, not at the "
               f"line the layout put at {NEEDLE_AT}")
        return 1

    def timed(run: Callable[[], int], count: int, what: str) -> Callable[[], float]:
        def arm() -> float:
            started = time.perf_counter()
            got = run()
            elapsed = time.perf_counter() - started
            expect(got == count, f"{what} found {got}, grep -c found {count}")
            return elapsed
        return arm

    return {
        "first match": timed(first, 1, "the first-match search"),
        "text scan": timed(lambda: whole_scan(client, trial_id, NEEDLE, False), expected,
                           "the text scan"),
        "regex scan": timed(lambda: whole_scan(client, trial_id, REGEX, True), expected,
                            "the regex scan"),
        "grep -c -F": timed(lambda: grep_count(path, NEEDLE, False), expected, "grep -F"),
        "grep -c -E": timed(lambda: grep_count(path, REGEX, True), expected, "grep -E"),
    }


def run(quick: bool) -> Outcome:
    megabytes = 100 if quick else 1000
    repetitions = 3 if quick else 5
    path = log_file(megabytes)
    with (tempfile.TemporaryDirectory(prefix="muster-bench-log-search-") as tmp,
          ServerProcess(Path(tmp)) as server, server.client() as client):
        trial_id = attach(client, path)
        measured = arms(client, trial_id, path)
        for arm in measured.values():
            arm()  # warm: the page cache, the server's first request
        samples = interleave(measured, repetitions)
    return _outcome(megabytes, samples)


def _outcome(megabytes: int, samples: dict[str, list[float]]) -> Outcome:
    first_s = median(samples["first match"])
    rows = [[what, f"{ms(median(times)):.1f}",
             "" if what == "first match" else f"{megabytes / median(times):.0f}"]
            for what, times in samples.items()]
    table = Table(f"(n) searching a {megabytes} MB log (median of "
                  f"{len(samples['first match'])})", ["what", "ms", "MB/s"], rows)
    targets = [Target(f"(n) a match in the first MiB of a {megabytes} MB log found over HTTP "
                      f"in ≤ {FIRST_MATCH_TARGET_S:.0f} s", f"{ms(first_s):.1f} ms",
                      first_s <= FIRST_MATCH_TARGET_S)]
    notes = ["Scans page through `GET /trials/{id}/logs/search` (1000 matches or 2 s a "
             "page) until complete; every count equalled `grep -c`'s.",
             f"regex: `{REGEX}` (RE2 on the server, grep -E beside it)."]
    return Outcome("log_search", [table], targets, notes, {"samples_s": samples,
                                                          "megabytes": megabytes})


if __name__ == "__main__":
    import run as benchmarks

    sys.exit(benchmarks.main(["--only", "log_search", *sys.argv[1:]]))
