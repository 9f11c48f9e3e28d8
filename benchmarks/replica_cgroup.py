"""(m) What a memory cgroup per replica costs (issue 31: every replica gets one, limit or not).

Three measurements, each interleaved with its baseline:

- the cgroup alone, in this process: `open_cgroup(None, name)` (find this process's memory
  cgroup, mkdir, no limit to write) then `close()` (rmdir), against `mkdir` + `rmdir` of a
  plain directory;
- the training process's start: `Popen(["true"])` with the cgroup join between fork and exec
  (`CgroupMemory.child_setup`, what the shim does), against the same Popen with a `preexec_fn`
  that does nothing (what the shim has anyway under a server, which passes the job's umask)
  and without any (Python can then use vfork);
- a whole shim, from its spawn to its exit (the exit record written), for a `true` child:
  with its replica cgroup ("auto"), with the RSS sampler and the kernel log instead
  ("watchdog": no cgroup), and the shim of the commit before this change (no memory guard at
  all without a limit; it also lacks every later change), all three run from
  `python -P -m muster.launch.shim SPEC` as the launcher does without its fork server. Every
  run must write an exit record with exit 0 and (but for the old shim) a peak. An interpreter
  start dominates these, so on a busy machine their medians differ by more than the cgroup
  costs: the target is on the first two.

Also timed: one sample of a one-process group by the sampler (`sample_group`: a /proc scan),
which a replica without a cgroup pays every 0.5 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from measure import children_cpu, expect, exported_src, interleave, median, ms
from report import Outcome, Table, Target

from muster.atomic import atomic_write_json, read_json
from muster.errors import LaunchError
from muster.launch.base import MemoryEnforcement, ReplicaSpec
from muster.launch.memory import open_cgroup, sample_group
from muster.launch.records import spec_to_json
from muster.rundir import RankFiles

BEFORE = "407a1cc"  # the last commit whose shim made no memory guard without a limit
TARGET_MS = 5.0  # what a replica's cgroup may cost: made, joined, removed


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def cgroup_alone(root: Path, counter: list[int]) -> float:
    def made_and_removed() -> None:
        counter[0] += 1
        open_cgroup(None, f"muster-bench-{os.getpid()}-{counter[0]}").close()

    return _timed(made_and_removed)


def plain_directory(root: Path, counter: list[int]) -> float:
    def made_and_removed() -> None:
        counter[0] += 1
        path = root / f"dir-{counter[0]}"
        path.mkdir()
        path.rmdir()

    return _timed(made_and_removed)


def _nothing() -> None:
    """A preexec_fn that does nothing."""


def spawn(how: str, counter: list[int]) -> float:
    """Popen of `true` to its exit: joining a fresh replica cgroup between fork and exec
    ("join"), running a preexec_fn that does nothing ("noop"), or neither ("none"); the
    cgroup is made before the clock starts and removed after it stops."""
    counter[0] += 1
    guard = open_cgroup(None, f"muster-bench-spawn-{os.getpid()}-{counter[0]}")
    try:
        setup = {"join": guard.child_setup(), "noop": _nothing, "none": None}[how]
        started = time.perf_counter()
        code = subprocess.run(["true"], preexec_fn=setup, check=False).returncode
        elapsed = time.perf_counter() - started
    finally:
        guard.close()
    expect(code == 0, f"true exited {code}")
    return elapsed


def shim_run(root: Path, counter: list[int], enforcement: MemoryEnforcement,
             pythonpath: str | None) -> tuple[float, float]:
    """A shim from spawn to exit for a `true` child, wall clock and CPU (the shim's and its
    child's, user + system); checks its exit record."""
    counter[0] += 1
    attempt_dir = root / f"shim-{counter[0]}"
    attempt_dir.mkdir()
    spec = ReplicaSpec(trial_uuid="bench", attempt=counter[0], rank=0, argv=["true"], env={},
                       cwd=attempt_dir, attempt_dir=attempt_dir,
                       memory_enforcement=enforcement)
    files = RankFiles(attempt_dir, 0)
    atomic_write_json(files.spec, spec_to_json(spec))
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cpu_before = children_cpu()
    started = time.perf_counter()
    with files.shim_log.open("ab") as shim_log:
        code = subprocess.run([sys.executable, "-P", "-m", "muster.launch.shim",
                               str(files.spec)], cwd=attempt_dir, env=env, check=False,
                              stdin=subprocess.DEVNULL, stderr=shim_log).returncode
    elapsed = time.perf_counter() - started
    cpu = children_cpu() - cpu_before
    record = read_json(files.exit)
    expect(code == 0 and isinstance(record, dict) and record.get("returncode") == 0,
           f"the shim ({enforcement}, {pythonpath or 'this tree'}) failed: {code} {record}")
    assert isinstance(record, dict)
    expect(pythonpath is not None or record.get("peak_rss_bytes") is not None,
           f"the shim ({enforcement}) recorded no peak: {record}")
    return elapsed, cpu


def run(quick: bool) -> Outcome:
    repetitions = 5 if quick else 30
    try:
        open_cgroup(None, f"muster-bench-probe-{os.getpid()}").close()
    except LaunchError as exc:
        return Outcome("replica_cgroup", [], [], notes=[f"skipped: {exc}"])
    with tempfile.TemporaryDirectory(prefix="muster-bench-cgroup-") as tmp:
        root = Path(tmp)
        counter = [0]
        before = exported_src(BEFORE, root)
        alone = interleave({
            "cgroup made + removed": lambda: cgroup_alone(root, counter),
            "plain mkdir + rmdir": lambda: plain_directory(root, counter),
        }, repetitions * 10)
        spawned = interleave({
            "Popen(true), joining the cgroup": lambda: spawn("join", counter),
            "Popen(true), a no-op preexec_fn": lambda: spawn("noop", counter),
            "Popen(true), no preexec_fn": lambda: spawn("none", counter),
        }, repetitions * 4)
        arms = {
            "shim, replica cgroup (auto)": lambda: shim_run(root, counter, "auto", None),
            "shim, sampler + kernel log": lambda: shim_run(root, counter, "watchdog", None),
            f"shim before ({BEFORE}), no guard": lambda: shim_run(root, counter, "auto",
                                                                    before),
        }
        for arm in arms.values():  # bytecode compiled, page cache warm
            arm()
        shims = interleave(arms, repetitions)
        sample = interleave({"sample_group (1 process)": lambda: _timed(
            lambda: sample_group(os.getpid()))}, repetitions * 10)
    results = alone | spawned | sample
    medians = {name: median(values) for name, values in results.items()}
    rows = [[name, f"{ms(value):.2f}", "", str(len(results[name]))]
            for name, value in medians.items()]
    for name, runs in shims.items():
        rows.append([name, f"{ms(median([wall for wall, _ in runs])):.1f}",
                     f"{ms(median([cpu for _, cpu in runs])):.1f}", str(len(runs))])
    added = ms(medians["cgroup made + removed"] + medians["Popen(true), joining the cgroup"]
               - medians["Popen(true), a no-op preexec_fn"])
    return Outcome(
        "replica_cgroup",
        [Table("(m) a memory cgroup per replica (median ms)", ["what", "ms", "CPU ms", "runs"],
               rows)],
        [Target(f"a replica's cgroup, made, joined and removed, costs ≤ {TARGET_MS:.0f} ms",
                f"{added:.2f} ms", added <= TARGET_MS)],
        data={"samples_s": results | shims},
    )


if __name__ == "__main__":
    outcome = run("--quick" in sys.argv)
    for table in outcome.tables:
        print(table.title)
        for row in table.rows:
            print("  ", *row)
    for target in outcome.targets:
        print(target)
