"""(q2) Trial throughput against Ray Tune: N trivial trials of a random search, 2 at a time
on the same 2 CPUs, muster against Ray Tune's `Tuner`, with `xargs -P 2` as the floor.

- muster: a fresh server (`muster up --slots 2`, SQLite), warmed up by one experiment; one
  experiment of `searcher: {name: random, max_trials: N, max_concurrent_trials: 2,
  max_length: 1}` whose trial is a harness script reporting one validation value of its
  `x` at step 1 (`verify.require_metrics: [loss]`), from the create call until the
  experiment has COMPLETED (its `ended_at`); every trial must be SUCCEEDED and verified
  (its planned length reached, its metric reported).
- Ray Tune: `tune_trivial.py`, a fresh local Ray (`ray.init(num_cpus=2)`) in a
  loopback-only network namespace, `Tuner.fit()` of a function trainable reporting the same
  value, `num_samples=N`, `max_concurrent_trials=2`, one CPU each; timed inside: the fit,
  and apart the `ray.init` before it; every trial must end with its metric. Two arms: Tune's
  defaults, and `reuse_actors=True` (its advice for many short trials).
- `xargs -P 2 -n 1 python -c` of N `pass` (the interpreter's start-up, nothing else).

Interleaved, medians. Needs root (the namespace) and Ray Tune: `make bench-tune` runs it
from the Ray bench venv (.venv-bench-ray). `--quick`: 20 trials, 1 repetition.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from measure import expect, interleave, median
from muster_server import ServerProcess
from queue_throughput import xargs_run
from report import Outcome, Table, Target

HERE = Path(__file__).resolve().parent
NAMESPACE = "muster-bench-tune"
TIMEOUT_S = 900.0
TRAIN = """\
import muster.harness as mh

with mh.init() as ctx:
    ctx.report_validation(1, {"loss": (ctx.hparams["x"] - 0.3) ** 2})
"""
SEARCH = """\
name: tune-peer-{n}
entrypoint: python train.py
harness: true
verify: {{require_checkpoint: false, require_metrics: [loss]}}
hyperparameters:
  x: {{type: double, minval: 0, maxval: 1}}
searcher: {{name: random, metric: loss, max_trials: {trials}, max_concurrent_trials: 2,
           max_length: 1}}
reproducibility: {{experiment_seed: {n}}}
"""


@dataclass(frozen=True)
class Size:
    trials: int
    repetitions: int


FULL = Size(100, 3)
QUICK = Size(20, 1)


def tune_missing() -> str | None:
    """Why the Ray Tune arm cannot run here, or None."""
    try:
        import ray.tune  # noqa: F401
    except ImportError as exc:
        return f"no Ray Tune in this interpreter ({exc}): run `make bench-tune`"
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode:
        return "cannot make a network namespace (needs root and iproute2)"
    return None


@contextlib.contextmanager
def loopback_namespace(name: str = NAMESPACE) -> Iterator[str]:
    """A network namespace whose only link is `lo`, up, for a local Ray to run in (outside
    one it picks the machine's external address); deleted on the way out."""
    subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


class TuneArm:
    """One `tune_trivial.py` run in the namespace: the fit's seconds (and the init's);
    `reuse`: with `TuneConfig(reuse_actors=True)`, Tune's setting for many short trials."""

    def __init__(self, trials: int, reuse: bool) -> None:
        self.trials, self.reuse, self.runs = trials, reuse, 0
        self.init_s: list[float] = []

    def __call__(self) -> float:
        self.runs += 1
        done = subprocess.run(
            ["ip", "netns", "exec", NAMESPACE, sys.executable, str(HERE / "tune_trivial.py"),
             str(self.trials), str(self.runs), "reuse" if self.reuse else "fresh"],
            capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        expect(done.returncode == 0, f"tune_trivial.py exited {done.returncode}: "
                                     f"{done.stderr[-800:]!r}")
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        expect(answer["ended"] == self.trials,
               f"Ray Tune ended {answer['ended']} of {self.trials} trials with a metric")
        self.init_s.append(float(answer["init_s"]))
        return float(answer["fit_s"])


class MusterArm:
    """One search of `trials` on a fresh 2-slot server: create → the experiment's end."""

    def __init__(self, trials: int) -> None:
        self.trials, self.runs = trials, 0

    def __call__(self) -> float:
        self.runs += 1
        with tempfile.TemporaryDirectory(prefix="muster-bench-tune-peer-") as tmp:
            root = Path(tmp)
            context = root / "context"
            context.mkdir()
            (context / "train.py").write_text(TRAIN)
            with ServerProcess(root, slots=2) as server, server.client() as client:
                warm = client.create_experiment(SEARCH.format(n=0, trials=1), context)
                client.wait_experiment(int(warm["id"]), poll=0.05)
                start = time.time()
                made = client.create_experiment(
                    SEARCH.format(n=self.runs, trials=self.trials), context)
                ended = _wait(client, int(made["id"]), start)
        return ended


def _wait(client: object, experiment_id: int, start: float) -> float:
    from muster.client import Client

    assert isinstance(client, Client)
    while True:
        exp = client.get_experiment(experiment_id)
        if exp["state"] in ("COMPLETED", "CANCELED", "ERROR"):
            break
        expect(time.time() - start < TIMEOUT_S, f"the search is still {exp['state']}")
        time.sleep(0.2)
    expect(exp["state"] == "COMPLETED", f"the search ended {exp['state']}: {exp['message']}")
    trials = exp["trials"]
    expect(len(trials) == exp["trials_total"] and all(
        t["state"] == "SUCCEEDED" and t["verified"] for t in trials),
        "every trial SUCCEEDED and verified: " + ", ".join(
            f"{t['id']} {t['state']} {t['verdict']}" for t in trials
            if not (t["state"] == "SUCCEEDED" and t["verified"]))[:800])
    return float(exp["ended_at"] or time.time()) - start


def run(quick: bool) -> Outcome:
    size = QUICK if quick else FULL
    missing = tune_missing()
    if missing is not None:
        return Outcome("tune_peer", [], [], [f"skipped: {missing}"], {"skipped": missing})
    with loopback_namespace():
        tune = TuneArm(size.trials, reuse=False)
        arms = {"xargs": lambda: xargs_run(size.trials), "muster": MusterArm(size.trials),
                "ray_tune": tune, "ray_tune_reuse": TuneArm(size.trials, reuse=True)}
        xargs_run(10)  # the interpreter's files in the page cache
        times = interleave(arms, size.repetitions)
    return _outcome(size, times, tune.init_s)


def _outcome(size: Size, times: dict[str, list[float]], init_s: list[float]) -> Outcome:
    rate = {arm: size.trials / median(values) for arm, values in times.items()}
    labels = {"xargs": "`xargs -P 2 -n 1 python -c pass` (the floor)",
              "muster": "muster: one `random` search, 2 slots (create → COMPLETED)",
              "ray_tune": "Ray Tune: `Tuner.fit()`, 2 CPUs (`ray.init` apart)",
              "ray_tune_reuse": "Ray Tune, `reuse_actors=True`"}
    rows = [[labels[arm], f"{median(values):.2f}", f"{min(values):.2f}", f"{max(values):.2f}",
             f"{rate[arm]:.1f}", f"{rate[arm] / rate['xargs']:.2f}"]
            for arm, values in times.items()]
    table = Table(f"(q2) {size.trials} trivial trials, 2 at a time ({size.repetitions} "
                  "interleaved runs)", ["arm", "median s", "min s", "max s", "trials/s",
                                        "/ xargs"], rows)
    tune_best = max(rate["ray_tune"], rate["ray_tune_reuse"])
    targets = [Target(f"(q2) muster's trial throughput ahead of Ray Tune's (its faster arm) "
                      f"on the same 2 CPUs ({size.trials} trials)",
                      f"{rate['muster']:.1f} vs {tune_best:.1f} trials/s",
                      rate["muster"] > tune_best)]
    notes = [f"`ray.init` before each fit (not in its time): median {median(init_s):.2f} s.",
             "Each muster trial is a new interpreter importing muster.harness under its own "
             "shim, verified when it ends; each Ray Tune trial a function call in a Ray "
             "worker process: by default a new actor per trial, with `reuse_actors=True` "
             "the actors of ended trials run the next ones."]
    return Outcome("tune_peer", [table], targets, notes,
                   {"times_s": times, "ray_init_s": init_s, "trials": size.trials})


def main() -> int:
    import run as benchmarks

    return benchmarks.main(["--only", "tune_peer", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
