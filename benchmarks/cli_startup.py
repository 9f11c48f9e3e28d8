"""(c2) CLI start-up: whole `muster` processes, from exec to exit, against bare Python.

Arms, interleaved: `python -c pass` (the floor), `muster --version`, `muster --help`,
`muster experiment list` and `muster job list` against a real server holding 20 finished
experiments, and, to show where the rest goes, `python -c 'import typer'` and
`python -c 'import httpx'` (what the client's plain calls no longer import: they go through
`muster.http_transport`; only streams import it). Every run must exit 0 and print what it
should: the version, the command list, all 20 experiments.

Alone: `.venv/bin/python benchmarks/cli_startup.py [--quick]`, reported and saved as
`run.py --only cli_startup` does.
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

PYTHON = sys.executable
MUSTER = str(Path(sys.executable).parent / "muster")
EXPERIMENTS = 20
CONFIG = 'name: bench-cli\nentrypoint: python -c "pass"\n'
TARGETS_S = {"muster --help": 0.20, "muster experiment list": 0.25}


def _timed(argv: list[str], env: dict[str, str], check: Callable[[str], bool]
           ) -> Callable[[], float]:
    def once() -> float:
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - start
        expect(done.returncode == 0 and check(done.stdout),
               f"{' '.join(argv)} exited {done.returncode}: {done.stdout[-300:]}"
               f"{done.stderr[-300:]}")
        return elapsed
    return once


def run(quick: bool) -> Outcome:
    repetitions = 5 if quick else 21
    with tempfile.TemporaryDirectory(prefix="muster-bench-cli-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
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

            def lists_all(out: str) -> bool:
                return all(f" {i} " in out for i in ids)

            arms = {
                "python -c pass": _timed([PYTHON, "-c", "pass"], env, lambda out: True),
                "muster --version": _timed([MUSTER, "--version"], env,
                                           lambda out: out.startswith("muster ")),
                "muster --help": _timed([MUSTER, "--help"], env,
                                        lambda out: "experiment" in out and "Usage" in out),
                "muster experiment list": _timed([MUSTER, "experiment", "list"],
                                                 env, lists_all),
                "muster job list": _timed([MUSTER, "job", "list"], env, lambda out: True),
                "python -c 'import typer'": _timed([PYTHON, "-c", "import typer"], env,
                                                   lambda out: True),
                "python -c 'import httpx'": _timed([PYTHON, "-c", "import httpx"], env,
                                                   lambda out: True),
            }
            for arm in arms.values():
                arm()  # warm-up: the page cache, the server's first queries
            samples = interleave(arms, repetitions)
    return _outcome(samples, repetitions)


def _outcome(samples: dict[str, list[float]], repetitions: int) -> Outcome:
    floor = median(samples["python -c pass"])
    rows = [[name, f"{ms(median(values)):.0f}", f"{ms(min(values)):.0f}",
             f"{ms(max(values)):.0f}", f"{ms(median(values) - floor):.0f}"]
            for name, values in samples.items()]
    table = Table("(c2) CLI start-up: whole process, exec to exit",
                  ["command", "median ms", "min ms", "max ms", "over `python -c pass`, ms"],
                  rows)
    targets = [Target(f"(c2) `{name}` ≤ {limit:.2f} s (median)",
                      f"{median(samples[name]):.3f} s", median(samples[name]) <= limit)
               for name, limit in TARGETS_S.items()]
    notes = [f"{repetitions} interleaved runs of each after one warm-up run; the server holds "
             f"{EXPERIMENTS} finished experiments; `muster` is the venv's console script, its "
             "modules' bytecode cached (as after `pip install`)."]
    return Outcome("cli_startup", [table], targets, notes, {"samples_s": samples})


if __name__ == "__main__":
    import run as benchmarks

    sys.exit(benchmarks.main(["--only", "cli_startup", *sys.argv[1:]]))
