"""Per-experiment environments: what a cached one adds to a trial's start, and a first build.

1. Start cost. A trial whose environment is built already pays for its own layer (made at
   its first launch: `Environments.for_trial` + `prepare`) and for starting Python through
   the layer's `.pth` chain. Side by side, interleaved: `python -c pass` on muster's own
   interpreter (how a trial started before environments) against making a fresh layer over
   a cached build and running `python -c pass` in it. Target: at most 20 ms more.
2. First build of a one-package environment (`six`, a clean venv: `inherit: false`) on a
   warm uv cache, through muster's own build (a child process: `uv venv`, pip from the base
   interpreter's bundled wheel, `uv pip install`, `uv pip freeze`, publishing) against
   `python -m venv` + `pip install six` on a warm pip cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import expect, interleave, median, ms
from report import Outcome, Table, Target

from muster.config import load_config
from muster.environments.registry import Environments
from muster.environments.request import build_request

TARGET_MS = 20.0
PACKAGE = "six"


def _build(envs: Environments, config_text: str, context: Path) -> float:
    """Seconds from asking to a published environment (muster's build, end to end)."""
    request = build_request(load_config(config_text, source="bench"), context,
                            runtime=envs.runtime)
    expect(request is not None, "the config builds nothing")
    assert request is not None
    key = envs.keep_request(request)
    started = time.perf_counter()
    envs.start(key)
    while (state := envs.state(key)).state == "BUILDING":
        time.sleep(0.005)
    expect(state.state == "READY", f"the build failed: {state.message}")
    return time.perf_counter() - started


def _venv_and_pip(where: Path) -> float:
    shutil.rmtree(where, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    subprocess.run([str(where / "bin" / "pip"), "install", "--quiet", PACKAGE], check=True,
                   capture_output=True)
    return time.perf_counter() - started


def _python_pass(python: Path | str) -> float:
    started = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], check=True)
    return time.perf_counter() - started


def run(quick: bool) -> Outcome:
    repetitions = 5 if quick else 21
    builds = 2 if quick else 5
    with tempfile.TemporaryDirectory(prefix="muster-bench-envs-") as tmp:
        root = Path(tmp)
        context = root / "context"
        context.mkdir()
        envs = Environments(root / "envs")
        # 1. the start of a trial whose environment is cached
        cached = "name: b\nentrypoint: python t.py\nenvironment:\n  pip: [six]\n"
        _build(envs, cached, context)
        config = load_config(cached, source="bench")
        request = build_request(config, context, runtime=envs.runtime)
        assert request is not None
        layers = iter(range(10**6))

        def fresh_layer() -> float:
            started = time.perf_counter()
            env = envs.for_trial(config, request.key, root / "runs" / str(next(layers)) / "env")
            envs.prepare(env)
            subprocess.run([str(env.layer / "bin" / "python"), "-c", "pass"], check=True)
            return time.perf_counter() - started

        def default_layer() -> float:
            plain = load_config("name: b\nentrypoint: python t.py\n", source="bench")
            started = time.perf_counter()
            env = envs.for_trial(plain, None, root / "runs" / str(next(layers)) / "env")
            envs.prepare(env)
            subprocess.run([str(env.layer / "bin" / "python"), "-c", "pass"], check=True)
            return time.perf_counter() - started

        fresh_layer(), default_layer()  # the interpreter facts are asked once per server
        starts = interleave({"plain": lambda: _python_pass(sys.executable),
                             "cached": fresh_layer, "default": default_layer}, repetitions)
        # 2. a first build against venv + pip, caches warm (one of each first)
        clean = f"environment:\n  pip: [{PACKAGE}]\n  inherit: false\n"
        counter = iter(range(10**6))

        def muster_build() -> float:
            # A fresh hash each time: the setup command differs by a no-op argument.
            text = (f"name: b\nentrypoint: python t.py\n{clean}"
                    f"  setup: [[python, -c, pass, '{next(counter)}']]\n")
            return _build(envs, text, context)

        baseline_dir = root / "venv"
        muster_build(), _venv_and_pip(baseline_dir)
        first_builds = interleave({"muster": muster_build,
                                   "venv+pip": lambda: _venv_and_pip(baseline_dir)}, builds)
    plain, layered, default = (median(starts[k]) for k in ("plain", "cached", "default"))
    added = ms(layered - plain)
    uv_s, pip_s = median(first_builds["muster"]), median(first_builds["venv+pip"])
    return Outcome(
        name="environments",
        tables=[
            Table(f"A trial's start: `python -c pass`, median of {repetitions}",
                  ["how", "ms"],
                  [["muster's interpreter, no layer (before environments)", f"{ms(plain):.1f}"],
                   ["a new layer over a cached build, then python in it", f"{ms(layered):.1f}"],
                   ["a new layer over muster's interpreter (no environment block)",
                    f"{ms(default):.1f}"]]),
            Table(f"First build of a one-package environment ({PACKAGE}, clean), warm caches, "
                  f"median of {builds}", ["how", "s"],
                  [["muster (uv venv, uv pip install, freeze, publish)", f"{uv_s:.2f}"],
                   ["python -m venv + pip install", f"{pip_s:.2f}"],
                   ["ratio (venv+pip / muster)", f"{pip_s / uv_s:.1f}x"]]),
        ],
        targets=[Target(f"a cached environment adds at most {TARGET_MS:g} ms to a trial's "
                        "start", f"{added:.1f} ms", added <= TARGET_MS)],
        notes=["muster's build includes a setup command (`python -c pass`) that makes each "
               "hash new, so every repetition is a first build; uv's cache is warm for six "
               "and for pip's wheel, as pip's cache is for the baseline."],
        data={"starts": starts, "first_builds": first_builds},
    )


if __name__ == "__main__":
    outcome = run(quick="--quick" in sys.argv)
    for table in outcome.tables:
        print(table.title)
        for row in table.rows:
            print("  ", row)
    for target in outcome.targets:
        print(target)
