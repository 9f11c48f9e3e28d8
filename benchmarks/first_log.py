"""(a) Submit → first log line seen by a follower, against a bare `python -c 'print(1)'`.

Baseline: Popen of `python -c 'print(1)'` until "1" is read from its stdout. muster: from
calling the SDK's `create_experiment` (entrypoint `python -c "print(1)"`) until
`follow_logs(trial_id, attempt=1)`, started right after create returns, yields its first
byte; against a real server subprocess on a fresh home, warmed up by one experiment.

Each muster run also reads the stamps its files carry, to show where the time goes:
`launch.json` (shim started), `shim.json` (training process started) and the first line of
the log index (first chunk written to the log).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from measure import BenchmarkFailure, expect, interleave, median, ms
from muster_server import ServerProcess
from report import Outcome, Table, Target

from muster import errors
from muster.atomic import read_json
from muster.client import Client
from muster.rundir import RankFiles

CONFIG = 'name: bench-first-log\nentrypoint: python -c "print(1)"\n'
TARGET_ADDED_MS = 150.0
FOLLOW_TRIES = 5

# Stages of a muster run, in order, with what happens between the previous stage and this.
STAGES = {
    "create_returned": "POST /experiments: pack and upload the context, store the trial",
    "shim_launched": "orchestrator wakes, plans the attempt, writes the spec, starts the shim",
    "child_started": "shim interpreter start-up and imports, then Popen of the entrypoint",
    "first_byte_logged": "entrypoint interpreter start-up, print, shim reads the pipe",
    "seen_by_follower": "follower's next poll of the log file, HTTP chunk to the SDK",
}


@dataclass
class MusterRun:
    stages: dict[str, float]  # seconds from calling create_experiment
    follow_retries: int

    @property
    def seen(self) -> float:
        return self.stages["seen_by_follower"]


def bare_start() -> float:
    """Seconds from Popen of `python -c 'print(1)'` until "1" is read from its stdout."""
    start = time.perf_counter()
    with subprocess.Popen([sys.executable, "-c", "print(1)"], stdout=subprocess.PIPE) as proc:
        stdout = proc.stdout
        if stdout is None:
            raise BenchmarkFailure("Popen gave no stdout pipe")
        first = stdout.read(1)
        elapsed = time.perf_counter() - start
        rest = stdout.read()
    expect(first + rest == b"1\n", f"bare python printed {first + rest!r}, not b'1\\n'")
    return elapsed


class Submitter:
    """One muster run per call: create, follow to the end, wait for the experiment."""

    def __init__(self, client: Client, context: Path) -> None:
        self.client = client
        self.context = context

    def __call__(self) -> MusterRun:
        wall_start, start = time.time(), time.perf_counter()
        experiment = self.client.create_experiment(CONFIG, self.context)
        created = time.perf_counter() - start
        trial_id = int(experiment["trials"][0]["id"])
        seen, data, retries = self._follow(trial_id, start)
        final = self.client.wait_experiment(int(experiment["id"]), poll=0.02)
        expect(data == b"1\n", f"trial {trial_id} logged {data!r}, not b'1\\n'")
        expect(final["state"] == "COMPLETED", f"experiment ended {final['state']}")
        run_dir = Path(self.client.get_trial(trial_id)["attempts"][0]["run_dir"])
        stages = {"create_returned": created, **_file_stages(run_dir, wall_start),
                  "seen_by_follower": seen}
        return MusterRun(stages, retries)

    def _follow(self, trial_id: int, start: float) -> tuple[float, bytes, int]:
        """Follow attempt 1 to its end; returns (first byte at, every byte, failed tries).

        A follow that fails before its first byte is retried (the clock keeps running) and
        counted: it is a fault of muster the benchmark reports, not a reason to stop.
        """
        for tries in range(FOLLOW_TRIES):
            seen: float | None = None
            data = b""
            try:
                for chunk in self.client.follow_logs(trial_id, attempt=1):
                    seen = time.perf_counter() - start if seen is None else seen
                    data += chunk
            except (errors.NotFound, httpx.HTTPError) as exc:
                if seen is not None:
                    raise
                print(f"  follow of trial {trial_id} failed before its first byte: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            if seen is None:
                raise BenchmarkFailure(f"the follow of trial {trial_id} ended without a byte")
            return seen, data, tries
        raise BenchmarkFailure(f"following trial {trial_id} failed {FOLLOW_TRIES} times")


def _file_stages(run_dir: Path, wall_start: float) -> dict[str, float]:
    files = RankFiles(run_dir, 0)
    launch, status = read_json(files.launch), read_json(files.status)
    first_index_line = files.index.read_text().split("\n", 1)[0]
    return {
        "shim_launched": float(launch["launched_at"]) - wall_start,
        "child_started": float(status["started_at"]) - wall_start,
        "first_byte_logged": float(first_index_line.split()[1]) - wall_start,
    }


def run(quick: bool) -> Outcome:
    repetitions = 5 if quick else 25
    with tempfile.TemporaryDirectory(prefix="muster-bench-first-log-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        with ServerProcess(Path(tmp)) as server, server.client() as client:
            submit = Submitter(client, context)
            submit()  # warm-up: server caches, the first connection, the page cache
            bare_start()
            samples = interleave({"bare": bare_start, "muster": submit}, repetitions)
    return _outcome(samples["bare"], samples["muster"])


def _outcome(bare: list[float], runs: list[MusterRun]) -> Outcome:
    seen = [r.seen for r in runs]
    added = ms(median(seen) - median(bare))
    retries = sum(r.follow_retries for r in runs)
    latency = Table(
        "(a) submit → first log line seen by a follower",
        ["measurement", "runs", "median ms", "min ms", "max ms"],
        [
            _row("bare `python -c 'print(1)'`: Popen → \"1\" read", bare),
            _row("muster: `create_experiment` → first byte from `follow_logs`", seen),
            ["**added by muster** (difference of medians)", "", f"**{added:.0f}**", "", ""],
        ],
    )
    names = list(STAGES)
    steps = [
        [r.stages[name] - (r.stages[names[i - 1]] if i else 0.0) for r in runs]
        for i, name in enumerate(names)
    ]
    breakdown = Table(
        "(a) where muster's time goes (median over the runs)",
        ["stage", "ms after create call", "ms from previous stage", "what happens in between"],
        [[name, f"{ms(median([r.stages[name] for r in runs])):.0f}",
          f"{ms(median(step)):.0f}", STAGES[name]] for name, step in zip(names, steps,
                                                                         strict=True)],
    )
    notes = [f"{len(runs)} interleaved runs of each, after one warm-up run of each; "
             f"follows that failed before their first byte and were retried: {retries}."]
    targets = [
        Target(f"(a) muster adds ≤ {TARGET_ADDED_MS:.0f} ms to the first log line (median)",
               f"{added:.0f} ms", added <= TARGET_ADDED_MS),
        Target("(a) every follow started right after create works at once",
               f"{retries} failed of {len(runs)}", retries == 0),
    ]
    data = {"bare_s": bare, "muster_stages_s": [r.stages for r in runs],
            "follow_retries": retries, "added_ms": added}
    return Outcome("first_log", [latency, breakdown], targets, notes, data)


def _row(label: str, values: list[float]) -> list[str]:
    return [label, str(len(values)), f"{ms(median(values)):.1f}", f"{ms(min(values)):.1f}",
            f"{ms(max(values)):.1f}"]
