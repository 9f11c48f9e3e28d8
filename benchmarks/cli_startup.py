"""(c2) CLI start-up: whole `muster` processes, from exec to exit, against bare Python.

Arms, interleaved: `python -c pass` (the floor), `muster --version`, `muster --help`,
`muster experiment list` (a table, and `--json`) and `muster job list` against a real server
holding 20 finished experiments, the same `experiment list` by the CLI of BEFORE (its `src/`
exported from git, run with `PYTHONPATH`), and, to show where the rest goes, `python -c
'import typer'`, `python -c 'import httpx'` (what the client's plain calls no longer import:
they go through `muster.http_transport`; only streams import it) and the libraries a listing
cannot do without (typer, rich's console and table, http.client). Every run must exit 0 and
print what it should: the version, the command list, all 20 experiments.

Each arm's median wall and CPU time (user + system, from wait4: what moves least when the
machine is busy), and its time over `python -c pass` as a ratio taken run by run, each run
against the `python -c pass` of the same repetition.

Alone: `.venv/bin/python benchmarks/cli_startup.py [--quick]`, reported and saved as
`run.py --only cli_startup` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from measure import children_cpu, expect, exported_src, interleave, median, ms
from muster_server import ServerProcess
from report import Outcome, Table, Target

PYTHON = sys.executable
MUSTER = str(Path(sys.executable).parent / "muster")
EXPERIMENTS = 20
CONFIG = 'name: bench-cli\nentrypoint: python -c "pass"\n'
TARGETS_S = {"muster --help": 0.20, "muster experiment list": 0.25}
TARGET_RATIO = 4.0  # issue 38: `muster experiment list` within 4x `python -c pass`
BEFORE = "a8428b6"  # the last commit before issue 38's start-up work
FLOOR = "import typer, rich.console, rich.table, http.client"
BARE = "python -c pass"
LIST = "muster experiment list"


class Sample(NamedTuple):
    wall: float  # seconds, exec to exit
    cpu: float  # user + system seconds of the process


def _timed(argv: list[str], env: dict[str, str], check: Callable[[str], bool]
           ) -> Callable[[], Sample]:
    def once() -> Sample:
        cpu_before = children_cpu()
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - start
        expect(done.returncode == 0 and check(done.stdout),
               f"{' '.join(argv)} exited {done.returncode}: {done.stdout[-300:]}"
               f"{done.stderr[-300:]}")
        return Sample(elapsed, children_cpu() - cpu_before)
    return once


def run(quick: bool) -> Outcome:
    repetitions = 5 if quick else 21
    with tempfile.TemporaryDirectory(prefix="muster-bench-cli-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        before = exported_src(BEFORE, Path(tmp))
        with ServerProcess(Path(tmp)) as server, server.client() as client:
            ids = [int(client.create_experiment(CONFIG, context)["id"])
                   for _ in range(EXPERIMENTS)]
            for experiment_id in ids:
                client.wait_experiment(experiment_id, poll=0.05)
            env = {**os.environ, "MUSTER_HOME": str(server.home), "MUSTER_URL": server.url,
                   "COLUMNS": "120"}
            # As installed: muster's modules compiled once (by the warm-up run), not
            # compiled anew by every start because the caller's shell forbids .pyc files.
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            arms = _arms(env, {**env, "PYTHONPATH": before}, ids)
            for arm in arms.values():
                arm()  # warm-up: the page cache, the server's first queries, the .pyc files
            samples = interleave(arms, repetitions)
    return _outcome(samples, repetitions)


def _arms(env: dict[str, str], env_before: dict[str, str], ids: list[int]
          ) -> dict[str, Callable[[], Sample]]:
    def lists_all(out: str) -> bool:
        return all(f" {i} " in out for i in ids)

    def lists_all_json(out: str) -> bool:
        return sorted(row["id"] for row in json.loads(out)) == sorted(ids)

    def anything(out: str) -> bool:
        return True

    listing = [MUSTER, "experiment", "list"]
    return {
        BARE: _timed([PYTHON, "-c", "pass"], env, anything),
        "muster --version": _timed([MUSTER, "--version"], env,
                                   lambda out: out.startswith("muster ")),
        "muster --help": _timed([MUSTER, "--help"], env,
                                lambda out: "experiment" in out and "Usage" in out),
        LIST: _timed(listing, env, lists_all),
        f"{LIST} (at {BEFORE})": _timed(listing, env_before, lists_all),
        f"{LIST} --json": _timed([*listing, "--json"], env, lists_all_json),
        "muster job list": _timed([MUSTER, "job", "list"], env, anything),
        "python -c 'import typer'": _timed([PYTHON, "-c", "import typer"], env, anything),
        "python -c 'import httpx'": _timed([PYTHON, "-c", "import httpx"], env, anything),
        f"python -c '{FLOOR}'": _timed([PYTHON, "-c", FLOOR], env, anything),
    }


def _outcome(samples: dict[str, list[Sample]], repetitions: int) -> Outcome:
    bare = samples[BARE]
    ratios = {name: [run.wall / floor.wall for run, floor in zip(values, bare, strict=True)]
              for name, values in samples.items()}
    floor_wall = median([s.wall for s in bare])
    rows = []
    for name, values in samples.items():
        walls = [s.wall for s in values]
        rows.append([name, f"{ms(median(walls)):.0f}", f"{ms(min(walls)):.0f}",
                     f"{ms(max(walls)):.0f}", f"{ms(median([s.cpu for s in values])):.0f}",
                     f"{ms(median(walls) - floor_wall):.0f}",
                     f"{median(ratios[name]):.1f}"])
    table = Table("(c2) CLI start-up: whole process, exec to exit",
                  ["command", "median ms", "min ms", "max ms", "CPU ms (median)",
                   f"over `{BARE}`, ms", f"ratio to `{BARE}` (run by run)"], rows)
    targets = [Target(f"(c2) `{name}` ≤ {limit:.2f} s (median)",
                      f"{median([s.wall for s in samples[name]]):.3f} s",
                      median([s.wall for s in samples[name]]) <= limit)
               for name, limit in TARGETS_S.items()]
    targets.append(Target(f"(c2) `{LIST}` ≤ {TARGET_RATIO:.0f} times `{BARE}` (median ratio)",
                          f"{median(ratios[LIST]):.1f} times",
                          median(ratios[LIST]) <= TARGET_RATIO))
    notes = [f"{repetitions} interleaved runs of each after one warm-up run; the server holds "
             f"{EXPERIMENTS} finished experiments; `muster` is the venv's console script, its "
             "modules' bytecode cached (as after `pip install`); CPU is user + system time."]
    return Outcome("cli_startup", [table], targets, notes,
                   {"samples_s": {name: [s.wall for s in values]
                                  for name, values in samples.items()},
                    "cpu_s": {name: [s.cpu for s in values]
                              for name, values in samples.items()}})


if __name__ == "__main__":
    import run as benchmarks

    sys.exit(benchmarks.main(["--only", "cli_startup", *sys.argv[1:]]))
