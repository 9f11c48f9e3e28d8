"""(r) Time to RUNNING for a trial of N = 1, 2, 4, 8 replicas, against starting N bare
Python processes.

Baseline: Popen of N `python -c ...` processes at once, until every one has printed its
first line (N interpreters started in parallel). muster: from calling the SDK's
`create_experiment` (a config with `resources: {replicas: N}` whose entrypoint prints a line
and sleeps) until `get_trial` shows the trial RUNNING, which muster records once every
replica's process has started; against a real server subprocess with N slots, warmed up by
one experiment. A third arm declares `harness: true` for a script that calls
`muster.harness.init()` before it sleeps: RUNNING then also waits for every rank's check-in
(the import of muster.harness and init()). Each muster run is then killed and waited for,
outside the measured time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import expect, interleave, median, ms
from muster_server import ServerProcess
from report import Outcome, Table

from muster.client import Client

SIZES = (1, 2, 4, 8)
SCRIPT = "import time; print('up', flush=True); time.sleep(600)"
HARNESS_SCRIPT = "import time\nimport muster.harness as mh\nwith mh.init():\n    time.sleep(600)\n"
POLL_S = 0.005
TIMEOUT_S = 60.0


def config(replicas: int, harness: bool = False) -> str:
    script = HARNESS_SCRIPT if harness else SCRIPT
    return (f"name: bench-replicas-{replicas}\n"
            f"entrypoint: {json.dumps(['python', '-c', script])}\n"
            f"harness: {json.dumps(harness)}\n"
            f"resources: {{replicas: {replicas}}}\n"
            "failure_policy: {stop_grace: 1s}\n")


def bare_start(replicas: int) -> float:
    """Seconds until N bare interpreters, started at once, have each printed a line."""
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE)
             for _ in range(replicas)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            expect(proc.stdout.readline() == b"up\n", "a bare process printed no line")
        return time.perf_counter() - start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


class MusterStart:
    def __init__(self, client: Client, context: Path, replicas: int,
                 harness: bool = False) -> None:
        self.client, self.context, self.replicas = client, context, replicas
        self.harness = harness

    def __call__(self) -> float:
        start = time.perf_counter()
        experiment = self.client.create_experiment(config(self.replicas, self.harness),
                                                   self.context)
        trial_id = experiment["trials"][0]["id"]
        deadline = start + TIMEOUT_S
        while (state := self.client.get_trial(trial_id)["state"]) != "RUNNING":
            expect(state in ("QUEUED", "STARTING"), f"trial {trial_id} became {state}")
            expect(time.perf_counter() < deadline, f"trial {trial_id} never became RUNNING")
            time.sleep(POLL_S)
        elapsed = time.perf_counter() - start
        self._stop(experiment["id"], trial_id)
        return elapsed

    def _stop(self, experiment_id: int, trial_id: int) -> None:
        self.client.kill_experiment(experiment_id)
        deadline = time.monotonic() + TIMEOUT_S
        while self.client.get_trial(trial_id)["state"] != "CANCELED":
            expect(time.monotonic() < deadline, f"trial {trial_id} did not stop")
            time.sleep(0.02)


def run(quick: bool) -> Outcome:
    repetitions = 3 if quick else 7
    times: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="muster-bench-replicas-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        with ServerProcess(Path(tmp), slots=max(SIZES)) as server, server.client() as client:
            MusterStart(client, context, 1)()  # warm-up: imports, caches, the store
            for replicas in SIZES:
                times[replicas] = interleave({
                    "bare": lambda n=replicas: bare_start(n),
                    "muster": MusterStart(client, context, replicas),
                    "muster, harness": MusterStart(client, context, replicas, harness=True),
                }, repetitions)
    return _outcome(times, repetitions)


def _outcome(times: dict[int, dict[str, list[float]]], repetitions: int) -> Outcome:
    rows = []
    for replicas, arms in times.items():
        bare, muster = median(arms["bare"]), median(arms["muster"])
        harness = median(arms["muster, harness"])
        rows.append([str(replicas), f"{ms(bare):.0f}", f"{ms(muster):.0f}",
                     f"{ms(muster - bare):+.0f}", f"{muster / bare:.2f}",
                     f"{ms(min(arms['muster'])):.0f}", f"{ms(max(arms['muster'])):.0f}",
                     f"{ms(harness):.0f}"])
    table = Table(
        f"(r) time to RUNNING, medians of {repetitions} interleaved runs",
        ["replicas", "bare: N interpreters up (ms)", "muster: create → RUNNING (ms)",
         "added (ms)", "ratio", "muster min (ms)", "muster max (ms)",
         "muster, harness: true: create → all checked in (ms)"],
        rows,
    )
    notes = ["muster's time includes the upload of an empty context, the orchestrator's "
             "next pass, one shim per replica (its own interpreter start) and the poll of "
             f"`get_trial` every {POLL_S * 1000:.0f} ms.",
             "The replicas' shims are started one after another by the supervisor; each "
             "starts its training process as soon as it is up.",
             "With `harness: true`, RUNNING waits for every rank's check-in as well: the "
             "script's import of muster.harness and init() (its first heartbeat)."]
    data = {"runs_s": {str(n): arms for n, arms in times.items()}}
    return Outcome("replicas", [table], [], notes, data)
