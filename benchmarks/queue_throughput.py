"""(q) Queue throughput: 1,000 trivial trials through a server with 2 slots, against
`xargs -P 2` running the same 1,000 commands; and submissions per second through the API.

Baseline: `xargs -P 2 -n 1 python -c` fed 1,000 lines of `pass` (the interpreter muster
runs on, which is what `python` in an entrypoint means), from its start until it exits.
muster: a fresh server subprocess with `--slots 2`, warmed up by one experiment; one SDK
client in one thread creates 1,000 experiments (`entrypoint: [python, -c, pass]`, an empty
context directory) as fast as the calls return, then asks `GET /cluster` every 0.5 s until
nothing is queued or running. The time is from the first create call to the latest trial's
`ended_at`; every trial must have SUCCEEDED. Afterwards (not timed) each trial's events and
its replica's process times show where the time went. A second muster arm does the same
with the 1,000 configs sent 100 a request (`Client.create_experiments`, one shared context
upload, each request's experiments stored in one transaction).

Submissions alone: a fresh server gets a burst of 200 creates of a trial that sleeps, so
the two slots fill once and the rest only queue (no trial churn while the clock runs), from
one thread and from four. The server's exit kills those trials.

(Named `queue_throughput`, not `queue`: run.py's folder comes first on `sys.path`, and a
`queue.py` there would shadow the standard library's, which `concurrent.futures` imports.)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from measure import expect, interleave, median, ms
from muster_server import ServerProcess
from report import Outcome, Table, Target

from muster.client import Client

SLOTS = 2
TARGET_RATIO = 0.5
POLL_S = 0.5
TIMEOUT_S = 1200.0
BURST_THREADS = (1, 4)
BATCH = 100  # configs a request in the batch-create arm
TRIVIAL = "name: q-{n}\nentrypoint: [python, -c, pass]\n"
SLEEPER = ("name: q-burst-{n}\nentrypoint: [python, -c, 'import time; time.sleep(600)']\n"
           "failure_policy: {{stop_grace: 1s}}\n")
# Stages of one trial, from its events and its replica's exit record, with what happens.
STAGES = {
    "queued": "created → STARTING: waits in the queue for a free slot and a supervisor pass",
    "shim_and_popen": "STARTING → child started: the pass writes the spec and starts the "
                      "shim; the shim's interpreter start and imports; Popen",
    "child_ran": "child started → child exited: `python -c pass` itself",
    "noticed": "child exited → SUCCEEDED: the shim's exit record, then the next supervisor "
               "pass settles the attempt",
    "slot_held": "STARTING → SUCCEEDED: the slot is taken for this long",
}


@dataclass(frozen=True)
class Size:
    trials: int
    burst: int
    repetitions: int


FULL = Size(1000, 200, 2)  # a muster run of 1,000 takes ~5 min here
QUICK = Size(100, 50, 1)


@dataclass
class QueueRun:
    wall_s: float  # first create call → the latest trial's ended_at
    submit_s: float  # first create call → the last create returned
    call_s: list[float]  # each create call
    stages: list[dict[str, float]]  # per trial, seconds
    slot_busy: float  # share of slot-seconds held by a trial during wall_s


@dataclass
class Burst:
    wall_s: float
    call_s: list[float]


def xargs_run(trials: int) -> float:
    """Seconds for `xargs -P 2` to run `python -c pass` `trials` times."""
    argv = ["xargs", "-P", str(SLOTS), "-n", "1", sys.executable, "-c"]
    start = time.perf_counter()
    done = subprocess.run(argv, input=b"pass\n" * trials, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    expect(done.returncode == 0, f"xargs exited {done.returncode}: {done.stderr[-500:]!r}")
    return elapsed


class FreshServer:
    """A new server with 2 slots and an empty context directory, warmed up by one trial."""

    def __init__(self, prefix: str) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix=prefix)
        root = Path(self._tmp.name)
        self.context = root / "context"
        self.context.mkdir()
        self._server = ServerProcess(root, slots=SLOTS)

    def __enter__(self) -> Client:
        self._server.__enter__()
        self.client = self._server.client()
        warm = self.client.create_experiment(TRIVIAL.format(n="warm-up"), self.context)
        self.client.wait_experiment(int(warm["id"]), poll=0.05)
        return self.client

    def __exit__(self, *exc: Any) -> None:
        self.client.close()
        self._server.__exit__(*exc)
        self._tmp.cleanup()


class MusterQueue:
    """One muster run per call: `trials` creates (one a request, or `batch` a request),
    then wait until every trial has ended."""

    def __init__(self, trials: int, batch: int = 1) -> None:
        self.trials, self.batch = trials, batch

    def __call__(self) -> QueueRun:
        server = FreshServer("muster-bench-queue-")
        with server as client:
            wall_start, start = time.time(), time.perf_counter()
            ids, call_s = (_submit(client, server.context, TRIVIAL, self.trials)
                           if self.batch == 1 else
                           _submit_batches(client, server.context, self.trials, self.batch))
            submit_s = time.perf_counter() - start
            _wait_idle(client, start)
            trials = [client.get_trial(trial_id) for trial_id in ids]
        for trial in trials:
            expect(trial["state"] == "SUCCEEDED",
                   f"trial {trial['id']} ended {trial['state']}: {trial['message']}")
        wall_s = max(float(t["ended_at"]) for t in trials) - wall_start
        stages = [_stages(t) for t in trials]
        busy = sum(s["slot_held"] for s in stages) / (SLOTS * wall_s)
        return QueueRun(wall_s, submit_s, call_s, stages, busy)


class BurstRun:
    """Seconds for `count` creates of a sleeping trial, from `threads` threads."""

    def __init__(self, count: int, threads: int) -> None:
        self.count, self.threads = count, threads

    def __call__(self) -> Burst:
        server = FreshServer("muster-bench-queue-burst-")
        with server as client, ThreadPoolExecutor(self.threads) as pool:
            share = [self.count // self.threads + (i < self.count % self.threads)
                     for i in range(self.threads)]
            start = time.perf_counter()
            parts = list(pool.map(lambda n: _submit(client, server.context, SLEEPER, n)[1],
                                  share))
            wall_s = time.perf_counter() - start
        return Burst(wall_s, [seconds for part in parts for seconds in part])


def _submit(client: Client, context: Path, config: str, count: int
            ) -> tuple[list[int], list[float]]:
    """Create `count` experiments one after another; their trial ids and each call's time."""
    ids, call_s = [], []
    for n in range(count):
        start = time.perf_counter()
        experiment = client.create_experiment(config.format(n=n), context)
        call_s.append(time.perf_counter() - start)
        ids.append(int(experiment["trials"][0]["id"]))
    return ids, call_s


def _submit_batches(client: Client, context: Path, count: int, batch: int
                    ) -> tuple[list[int], list[float]]:
    """Create `count` experiments, `batch` a request (`create_experiments`); their trial
    ids and each request's time."""
    ids, call_s = [], []
    for first in range(0, count, batch):
        texts = [TRIVIAL.format(n=n) for n in range(first, min(count, first + batch))]
        start = time.perf_counter()
        created = client.create_experiments(texts, context)
        call_s.append(time.perf_counter() - start)
        expect(len(created) == len(texts), f"{len(texts)} configs made {len(created)}")
        ids += [int(experiment["trials"][0]["id"]) for experiment in created]
    return ids, call_s


def _wait_idle(client: Client, start: float) -> None:
    """Return once nothing is queued or holds a slot (one cheap GET every POLL_S)."""
    while True:
        cluster = client.cluster_status()
        if cluster["queued"] == 0 and cluster["slots_in_use"] == 0:
            return
        expect(time.perf_counter() - start < TIMEOUT_S,
               f"{cluster['queued']} trials still queued after {TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)


def _stages(trial: dict[str, Any]) -> dict[str, float]:
    """The trial's stage durations in seconds (see STAGES)."""
    at = {event["to_state"] or event["reason"]: float(event["at"])
          for event in trial["events"] if event["entity"] == "trial"}
    replica = trial["attempts"][0]["replicas"][0]
    started, exited = float(replica["started_at"]), float(replica["ended_at"])
    return {
        "queued": at["STARTING"] - at["created"],
        "shim_and_popen": started - at["STARTING"],
        "child_ran": exited - started,
        "noticed": at["SUCCEEDED"] - exited,
        "slot_held": at["SUCCEEDED"] - at["STARTING"],
    }


def run(quick: bool) -> Outcome:
    size = QUICK if quick else FULL
    arms: dict[str, Any] = {
        "xargs": lambda: xargs_run(size.trials),
        "muster": MusterQueue(size.trials),
        "muster, batch create": MusterQueue(size.trials, BATCH),
    }
    arms.update({f"burst, {n} threads": BurstRun(size.burst, n) for n in BURST_THREADS})
    xargs_run(10)  # warm-up: the interpreter's files in the page cache
    samples = interleave(arms, size.repetitions)
    return _outcome(size, samples)


def _outcome(size: Size, samples: dict[str, list[Any]]) -> Outcome:
    xargs: list[float] = samples["xargs"]
    runs: list[QueueRun] = samples["muster"]
    batched: list[QueueRun] = samples["muster, batch create"]
    bursts = {n: samples[f"burst, {n} threads"] for n in BURST_THREADS}
    ratio = median(xargs) / median([r.wall_s for r in runs])
    batch_ratio = median(xargs) / median([r.wall_s for r in batched])
    tables = [_throughput_table(size, xargs, runs, ratio, batched, batch_ratio),
              _submission_table(size, runs, bursts, batched),
              _stage_table(size, xargs, runs, "one create a request"),
              _stage_table(size, xargs, batched, f"{BATCH} creates a request")]
    every = size.trials * (len(runs) + len(batched))
    targets = [
        Target(f"(q) {size.trials:,} trivial trials, 2 slots: muster ≥ "
               f"{TARGET_RATIO:.0%} of `xargs -P 2`'s throughput (medians)",
               f"{ratio:.0%} one create a request, {batch_ratio:.0%} with batch creates",
               max(ratio, batch_ratio) >= TARGET_RATIO),
        Target("(q) every trial SUCCEEDED", f"{every:,} of {every:,}", True),
    ]
    notes = [f"{size.repetitions} interleaved runs of each arm; each muster and burst run "
             "on a fresh server (its start and warm-up not timed).",
             "Submissions: one SDK client, creates one after another in one thread (the "
             "bursts: the same client shared by the threads).",
             f"While the {size.trials:,}-trial run waits, it asks `GET /cluster` every "
             f"{POLL_S:g} s; the end time is the latest trial's `ended_at`, not the poll."]
    data = {"xargs_s": xargs, "muster": [vars(r) for r in runs],
            "muster_batch": [vars(r) for r in batched],
            "bursts": {str(n): [vars(b) for b in b_runs] for n, b_runs in bursts.items()}}
    return Outcome("queue", tables, targets, notes, data)


def _throughput_table(size: Size, xargs: list[float], runs: list[QueueRun],
                      ratio: float, batched: list[QueueRun], batch_ratio: float) -> Table:
    walls = [r.wall_s for r in runs]
    rows = [_wall_row("`xargs -P 2 -n 1 python -c` (`pass`)", xargs, size.trials, 1.0),
            _wall_row("muster, `--slots 2`: first create → last trial SUCCEEDED", walls,
                      size.trials, ratio),
            _wall_row(f"the same, created {BATCH} a request (`create_experiments`)",
                      [r.wall_s for r in batched], size.trials, batch_ratio)]
    return Table(f"(q) {size.trials:,} trials of `python -c pass`, 2 at a time "
                 f"(medians of {len(runs)} interleaved runs)",
                 ["arm", "runs", "median s", "min s", "max s", "trials/s", "/ xargs"], rows)


def _wall_row(label: str, walls: list[float], trials: int, ratio: float) -> list[str]:
    return [label, str(len(walls)), f"{median(walls):.1f}", f"{min(walls):.1f}",
            f"{max(walls):.1f}", f"{trials / median(walls):.1f}", f"**{ratio:.0%}**"]


def _submission_table(size: Size, runs: list[QueueRun], bursts: dict[int, list[Burst]],
                      batched: list[QueueRun]) -> Table:
    rows = [_submission_row(f"during the {size.trials:,}-trial run (1 thread; trials "
                            "running, the queue growing)",
                            [r.submit_s for r in runs], [r.call_s for r in runs]),
            _submission_row(f"the same, {BATCH} configs a request (a call: a request)",
                            [r.submit_s for r in batched], [r.call_s for r in batched],
                            per_call=BATCH)]
    for threads, b_runs in bursts.items():
        rows.append(_submission_row(
            f"burst of {size.burst} sleeping trials, {threads} thread"
            f"{'s' if threads > 1 else ''} (slots full after 2, the rest queue)",
            [b.wall_s for b in b_runs], [b.call_s for b in b_runs]))
    return Table("(q) submissions through the API (`create_experiment`, medians)",
                 ["measurement", "runs", "creates", "submissions/s", "ms per call",
                  "first 50 calls ms", "last 50 calls ms"], rows)


def _submission_row(label: str, walls: list[float], calls: list[list[float]],
                    per_call: int = 1) -> list[str]:
    count = len(calls[0]) * per_call
    every = [seconds for run in calls for seconds in run]
    first = [seconds for run in calls for seconds in run[:50]]
    last = [seconds for run in calls for seconds in run[-50:]]
    return [label, str(len(walls)), str(count), f"{count / median(walls):.1f}",
            f"{ms(median(every)):.0f}", f"{ms(median(first)):.0f}", f"{ms(median(last)):.0f}"]


def _stage_table(size: Size, xargs: list[float], runs: list[QueueRun], how: str) -> Table:
    stages = [stage for run in runs for stage in run.stages]
    rows = []
    for name, what in STAGES.items():
        values = sorted(stage[name] for stage in stages)
        rows.append([name, f"{ms(median(values)):.0f}",
                     f"{ms(values[int(0.9 * (len(values) - 1))]):.0f}", what])
    busy = median([r.slot_busy for r in runs])
    per_slot = SLOTS * median([r.wall_s for r in runs]) / size.trials
    rows += [["slot per trial (2 slots * wall / trials)", f"{ms(per_slot):.0f}", "",
              f"the slots were held {busy:.0%} of the time, free the rest"],
             ["xargs: slot per command (2 slots * wall / commands)",
              f"{ms(SLOTS * median(xargs) / size.trials):.0f}", "", "the baseline's"]]
    return Table(f"(q) where muster's time goes, per trial ({len(stages):,} trials, {how})",
                 ["stage", "median ms", "p90 ms", "what happens"], rows)
