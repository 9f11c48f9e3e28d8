"""The runtime base (issue 31, item 5): what building it costs, and a trial's start over it.

1. Build. `ensure_base` on a fresh home: the plan (every installed distribution's metadata
   and requirements, the closures) and the base itself (a venv of links, from every
   distribution's RECORD), then the same call once more with nothing changed (the plan
   alone: what a server start pays, on a thread, before it finds the published base).
2. Start. Side by side, interleaved: `python` in a trial's layer over muster's own venv (how
   a trial without an environment block ran before) and in one over the runtime base, for
   `pass`, `import muster.harness` and `import torch, numpy, sklearn`. The base holds some
   20 distributions instead of ~130, and the imports go through links: the target is that a
   start costs no more CPU time (at most 5% or 5 ms more, the larger; CPU rather than wall
   time, which a loaded machine moves by more than that).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import expect, interleave, median, ms
from report import Outcome, Table, Target

from muster.environments.interpreters import own
from muster.environments.layers import lower_scripts, write_layer
from muster.environments.layout import EnvHome
from muster.environments.runtime_base import ensure_base

SNIPPETS = {"pass": "pass", "import muster.harness": "import muster.harness",
            "import torch, numpy, sklearn": "import torch, numpy, sklearn"}
TOLERANCE = 0.05
TOLERANCE_MS = 5.0


def _builds(root: Path, repetitions: int) -> tuple[list[float], list[float]]:
    """Seconds of a first build on a fresh home, and of a call that finds it built."""
    first, again = [], []
    for number in range(repetitions):
        layout = EnvHome(root / f"home-{number}" / "envs").ensure()
        started = time.perf_counter()
        ensure_base(layout, own())
        first.append(time.perf_counter() - started)
        started = time.perf_counter()
        ensure_base(layout, own())
        again.append(time.perf_counter() - started)
    return first, again


def _layer(root: Path, name: str, lower: tuple[str, ...], bin_dir: str, harness: Path) -> Path:
    layer = root / "runs" / name / "env"
    write_layer(layer, own(), lower, lower_scripts(bin_dir), harness)
    return layer


def _start(python: Path, code: str) -> tuple[float, float]:
    """(wall, CPU) seconds of `python -c code`: the CPU time (user + system, from wait4)
    is what the comparison rests on, since the wall time of a 3-second import moves with
    whatever else the machine runs."""
    started = time.perf_counter()
    child = subprocess.Popen([str(python), "-c", code], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - started
    expect(child.returncode == 0, f"{python} -c {code!r} failed: {err[-2000:]!r}")
    return elapsed, usage.ru_utime + usage.ru_stime


def run(quick: bool) -> Outcome:
    builds = 2 if quick else 5
    repetitions = 5 if quick else 15
    with tempfile.TemporaryDirectory(prefix="muster-bench-base-") as tmp:
        root = Path(tmp)
        first, again = _builds(root, builds)
        layout = EnvHome(root / "envs").ensure()
        harness = layout.ensure_harness()
        base = ensure_base(layout, own())
        pythons = {
            "muster's venv (before)": _layer(root, "venv", own().sites, own().bin_dir, harness),
            "the runtime base": _layer(root, "base", base.sites, base.bin_dir, harness),
        }
        starts: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for label, code in SNIPPETS.items():
            arms = {name: (lambda p=layer / "bin" / "python", c=code: _start(p, c))
                    for name, layer in pythons.items()}
            for arm in arms.values():  # the page cache and bytecode warm, once each
                arm()
            starts[label] = interleave(arms, repetitions)
    rows, targets = [], []
    for label, found in starts.items():
        wall = [median([w for w, _ in found[name]]) for name in pythons]
        before, after = (median([c for _, c in found[name]]) for name in pythons)
        rows.append([label, f"{ms(before):.1f}", f"{ms(after):.1f}", f"{after / before:.2f}",
                     f"{ms(wall[0]):.0f} / {ms(wall[1]):.0f}"])
        allowed = max(before * TOLERANCE, TOLERANCE_MS / 1000)
        targets.append(Target(f"`{label}` over the runtime base costs no more CPU (at most "
                              f"{TOLERANCE:.0%} or {TOLERANCE_MS:g} ms more)",
                              f"{ms(after - before):+.1f} ms", after - before <= allowed))
    return Outcome(
        name="runtime_base",
        tables=[
            Table(f"Building the runtime base ({len(base.packages)} distributions of "
                  f"{len(own().packages)} installed), median of {builds}", ["what", "s"],
                  [["first build on a fresh home (plan + links)", f"{median(first):.2f}"],
                   ["again, nothing changed (the plan alone)", f"{median(again):.2f}"]]),
            Table(f"A trial's start in its layer: CPU time (user + system), median of "
                  f"{repetitions}, ms", ["python -c", *pythons, "ratio", "wall ms (before / base)"],
                  rows),
        ],
        targets=targets,
        notes=["The build runs on a thread when the server starts, and at the first launch "
               "after the packages where muster runs changed; a launch otherwise pays two "
               "stat calls (interpreters.own's stamp)."],
        data={"first_builds": first, "again": again, "starts": starts},
    )


if __name__ == "__main__":
    outcome = run(quick="--quick" in sys.argv)
    for table in outcome.tables:
        print(table.title)
        for row in table.rows:
            print("  ", row)
    for target in outcome.targets:
        print(target)
