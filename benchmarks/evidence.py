"""What an evidence bundle costs: the collector on a stuck 2-rank gloo job (issue 31, item 2).

Two real ranks of a torch gloo group get stuck (rank 1 waits in all_reduce, rank 0 sleeps),
each in a process group of its own as a shim would run it. One repetition asks both ranks
for their parts of a bundle at once, as two shims would (`python -m muster.launch.evidence`
per rank, started together), and times it until both have exited with their `summary.json`
written. The baseline in the same repetitions: the tool alone, `py-spy dump --pid` of both
ranks at once (no --native, no /proc, no files).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from measure import expect, interleave, median, ms
from report import Outcome, Table, Target

from muster.launch.evidence import Tools, read_summary
from muster.rundir import AttemptDir, RunDir, new_bundle_id
from muster.states import EvidenceReason

TARGET_S = 2.0
RANK_SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 2), rank=rank, world_size=2)
print("stuck", flush=True)
if rank == 1:
    dist.all_reduce(torch.ones(4))
else:
    time.sleep(3600)
"""


@contextmanager
def stuck_ranks(root: Path) -> Iterator[tuple[AttemptDir, list[int]]]:
    """Two stuck ranks of one attempt; their process groups. Killed on the way out."""
    attempt = RunDir(root / "run").attempt(1)
    attempt.path.mkdir(parents=True)
    script = root / "rank.py"
    script.write_text(RANK_SCRIPT)
    procs = []
    try:
        for rank in (0, 1):
            with open(attempt.rank(rank).log, "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(script), str(root / "store")], stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    env={**os.environ, "RANK": str(rank)}))
        deadline = time.monotonic() + 120
        while not all(b"stuck" in attempt.rank(r).log.read_bytes() for r in (0, 1)):
            expect(time.monotonic() < deadline and all(p.poll() is None for p in procs),
                   "the two gloo ranks never got stuck")
            time.sleep(0.05)
        time.sleep(0.5)  # rank 1 into its all_reduce
        yield attempt, [p.pid for p in procs]
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _bundle(attempt: AttemptDir, pgids: list[int]) -> Callable[[], float]:
    def arm() -> float:
        bundle = new_bundle_id(EvidenceReason.REQUESTED)
        while attempt.evidence_of(bundle, 0).exists():  # one a second: wait for the next id
            time.sleep(0.05)
            bundle = new_bundle_id(EvidenceReason.REQUESTED)
        started = time.perf_counter()
        collectors = [subprocess.Popen(
            [sys.executable, "-m", "muster.launch.evidence", "--out",
             str(attempt.evidence_of(bundle, rank)), "--rank", str(rank), "--log",
             str(attempt.rank(rank).log), "--pgid", str(pgid)], stdout=subprocess.DEVNULL)
            for rank, pgid in enumerate(pgids)]
        codes = [c.wait() for c in collectors]
        elapsed = time.perf_counter() - started
        expect(codes == [0, 0], f"the collectors exited {codes}")
        lines = [read_summary(attempt.evidence_of(bundle, rank)) for rank in (0, 1)]
        expect(lines[1] is not None and "all_reduce" in lines[1].line,
               f"rank 1's summary does not name all_reduce: {lines[1]}")
        return elapsed
    return arm


def _py_spy_alone(pgids: list[int]) -> Callable[[], float]:
    py_spy = Tools.find().py_spy
    expect(py_spy is not None, "py-spy is not installed")

    def arm() -> float:
        started = time.perf_counter()
        dumps = [subprocess.Popen([str(py_spy), "dump", "--pid", str(pid)],
                                  stdout=subprocess.DEVNULL) for pid in pgids]
        codes = [d.wait() for d in dumps]
        expect(codes == [0, 0], f"py-spy exited {codes}")
        return time.perf_counter() - started
    return arm


def run(quick: bool) -> Outcome:
    repetitions = 5
    with tempfile.TemporaryDirectory(prefix="muster-bench-evidence-") as tmp, \
            stuck_ranks(Path(tmp)) as (attempt, pgids):
        samples = interleave({"bundle": _bundle(attempt, pgids),
                              "py-spy": _py_spy_alone(pgids)}, repetitions)
    bundle, alone = median(samples["bundle"]), median(samples["py-spy"])
    rows = [["evidence bundle, both ranks at once (collector per rank)", f"{ms(bundle):.0f}"],
            ["`py-spy dump --pid` of both ranks at once (the tool alone)", f"{ms(alone):.0f}"]]
    return Outcome(
        name="evidence",
        tables=[Table(f"Evidence of a stuck 2-rank gloo job (median of {repetitions})",
                      ["what", "ms"], rows)],
        targets=[Target(f"(item 2) an evidence bundle of a 2-rank job takes ≤ {TARGET_S:.0f} s",
                        f"{bundle:.2f} s (median of {repetitions})", bundle <= TARGET_S)],
        notes=["The bundle's time is mostly `py-spy dump --native` of a process that loaded "
               "torch (its symbols), about a second per rank; the ranks are read in parallel."],
        data={"bundle_s": samples["bundle"], "py_spy_alone_s": samples["py-spy"]})


if __name__ == "__main__":
    outcome = run(quick=False)
    for table in outcome.tables:
        print(table.title)
        for row in table.rows:
            print("  ", *row)
    print(outcome.targets[0].measured, "met" if outcome.targets[0].met else "NOT met")
