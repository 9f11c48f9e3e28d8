"""(s) Search: adaptive ASHA against random search on the digits example, by training spent.

Both arms run examples/digits/search.yaml's space and budget for real through a muster
server with 2 slots (a fresh server subprocess, one for the whole benchmark): the same
`max_trials`, `max_length` (epochs) and `max_concurrent_trials`, and the same
`experiment_seed`, with `searcher.name` random or adaptive_asha (search.yaml's ASHA
settings). Both searchers draw trial N from a random sampler seeded by the experiment seed
and N alone, and train.py seeds its run from MUSTER_SEED, so trial N gets the same
hyperparameters and learns the same curve in both arms: the arms differ only in which
trials ASHA stops early. Every trial must end SUCCEEDED (early stopped or not) with the same
hyperparameters in both arms.

The measure is training, in the searcher's unit (epochs = validation steps): from every
trial's validation reports in time order, the epochs all trials had completed when a trial
first reported a val_accuracy within 0.5 percentage points of random search's best (same
seed), and the epochs each arm spent in all. Wall time is reported but is not the measure:
here a trial's ~3 s of Python and torch start-up outweighs most of its training.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from math import inf
from pathlib import Path
from typing import Any

import yaml
from measure import expect, median
from muster_server import ServerProcess
from report import Outcome, Table, Target

from muster.client import Client

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"
SEARCH_YAML = DIGITS / "search.yaml"
METRIC = "val_accuracy"
WITHIN = 0.005  # 0.5 percentage points of random search's best
TARGET_RATIO = 0.40
POLL_S = 1.0
TIMEOUT_S = 1800.0
ARMS = ("random", "adaptive_asha")
ASHA_ONLY = ("mode", "divisor", "max_rungs")  # settings the random searcher refuses


@dataclass(frozen=True)
class Size:
    seeds: tuple[int, ...]
    max_trials: int | None  # None: search.yaml's
    max_length: int | None


FULL = Size(seeds=(1, 2, 3, 4, 5), max_trials=None, max_length=None)
QUICK = Size(seeds=(1,), max_trials=6, max_length=16)


@dataclass(frozen=True)
class Report:
    """One validation report of one trial."""

    trial: int  # the trial's number in its search
    step: int  # epochs completed
    time: float
    accuracy: float


@dataclass
class SearchRun:
    searcher: str
    seed: int
    wall_s: float  # created → ended
    reports: list[Report]
    hparams: dict[int, dict[str, Any]]  # by trial number
    early_stopped: int
    stop_steps: dict[int, int]  # by trial number: the step at which the searcher stopped it
    verified: int  # trials whose verification was recorded and passed

    def overshoot(self) -> list[int]:
        """Per early-stopped trial, the epochs it trained after the searcher's decision."""
        return [steps_spent([r for r in self.reports if r.trial == number]) - step
                for number, step in self.stop_steps.items()]


# -- the measure (pure) ----------------------------------------------------------------------


def best_accuracy(reports: Iterable[Report]) -> float:
    return max(r.accuracy for r in reports)


def steps_spent(reports: Iterable[Report]) -> int:
    """Epochs trained in all: each trial's highest validation step, summed."""
    highest: dict[int, int] = {}
    for r in reports:
        highest[r.trial] = max(highest.get(r.trial, 0), r.step)
    return sum(highest.values())


def stopped_at_decision(reports: Iterable[Report], stop_steps: Mapping[int, int]
                        ) -> list[Report]:
    """The reports as they would be had each stopped trial stopped at the step where the
    searcher decided to stop it (its later epochs are the latency of the stop)."""
    return [r for r in reports if r.step <= stop_steps.get(r.trial, r.step)]


@dataclass(frozen=True)
class Reached:
    report: Report  # the first report at or above the target
    epochs: int  # epochs all trials had completed by then


def first_reaching(reports: Iterable[Report], target: float) -> Reached | None:
    """The first report (by time) with an accuracy of at least `target`, and the epochs all
    trials had completed by then; None if no report reached it."""
    highest: dict[int, int] = {}
    for r in sorted(reports, key=lambda r: (r.time, r.trial, r.step)):
        highest[r.trial] = max(highest.get(r.trial, 0), r.step)
        if r.accuracy >= target:
            return Reached(r, sum(highest.values()))
    return None


@dataclass(frozen=True)
class Arm:
    """One arm of one seed by the measure: when it came within reach of the target, and
    what it spent in all."""

    reached: Reached | None
    spent: int


@dataclass(frozen=True)
class SeedResult:
    seed: int
    target: float
    random: Arm
    asha: Arm
    asha_at_decision: Arm  # ASHA's reports cut at each early stop's decision step

    def until_ratio(self, asha: Arm) -> float:
        """ASHA / random epochs to the target; infinite when ASHA never reached it. (Random
        search always reaches it: the target is below its own best.)"""
        if asha.reached is None or self.random.reached is None:
            return inf
        return asha.reached.epochs / self.random.reached.epochs

    def spent_ratio(self, asha: Arm) -> float:
        return asha.spent / self.random.spent


def compare(seed: int, random_reports: Sequence[Report], asha_reports: Sequence[Report],
            asha_stop_steps: Mapping[int, int]) -> SeedResult:
    """The two arms of one seed, by the measure in the module's docstring."""
    target = best_accuracy(random_reports) - WITHIN
    cut = stopped_at_decision(asha_reports, asha_stop_steps)
    return SeedResult(seed, target, _arm(random_reports, target), _arm(asha_reports, target),
                      _arm(cut, target))


def _arm(reports: Sequence[Report], target: float) -> Arm:
    return Arm(first_reaching(reports, target), steps_spent(reports))


# -- the runs ----------------------------------------------------------------------------------


def run(quick: bool) -> Outcome:
    size = QUICK if quick else FULL
    base = yaml.safe_load(SEARCH_YAML.read_text())
    runs: dict[int, dict[str, SearchRun]] = {}
    with tempfile.TemporaryDirectory(prefix="muster-bench-search-") as tmp:
        root = Path(tmp)
        context = _context(root / "context")
        with ServerProcess(root / "server", slots=2) as server, server.client() as client:
            for i, seed in enumerate(size.seeds):
                order = ARMS if i % 2 == 0 else ARMS[::-1]  # who goes first alternates
                runs[seed] = {name: _search(client, context, _config(base, name, seed, size))
                              for name in order}
    return _outcome(size, base, runs)


def _context(context: Path) -> Path:
    """train.py and the digits data, as one upload."""
    context.mkdir(parents=True)
    shutil.copy(DIGITS / "train.py", context)
    subprocess.run([sys.executable, str(DIGITS / "prepare_data.py"), "--out",
                    str(context / "data")], check=True, capture_output=True)
    return context


def _config(base: dict[str, Any], searcher: str, seed: int, size: Size) -> str:
    config = {**base, "name": f"bench-search-{searcher}-seed-{seed}"}
    block = {**base["searcher"], "name": searcher}
    if searcher == "random":
        block = {k: v for k, v in block.items() if k not in ASHA_ONLY}
    if size.max_trials is not None:
        block["max_trials"] = size.max_trials
    if size.max_length is not None:
        block["max_length"] = size.max_length
    config["searcher"] = block
    config["reproducibility"] = {**base.get("reproducibility", {}), "experiment_seed": seed}
    return yaml.safe_dump(config, sort_keys=False)


def _search(client: Client, context: Path, config: str) -> SearchRun:
    """Run one search to its end; its trials' validation reports and how they ended."""
    loaded = yaml.safe_load(config)
    print(f"  {loaded['name']}", file=sys.stderr, flush=True)
    exp = client.create_experiment(config, context)
    deadline = time.monotonic() + TIMEOUT_S
    while exp["state"] in ("ACTIVE", "PAUSED"):
        expect(time.monotonic() < deadline, f"experiment {exp['id']} did not end")
        time.sleep(POLL_S)
        exp = client.get_experiment(exp["id"])
    expect(exp["state"] == "COMPLETED", f"experiment {exp['id']} ended {exp['state']}")
    trials = exp["trials"]
    expect(len(trials) == loaded["searcher"]["max_trials"],
           f"experiment {exp['id']} ran {len(trials)} trials")
    for trial in trials:
        expect(trial["state"] == "SUCCEEDED",
               f"trial {trial['id']} ended {trial['state']}: {trial['message']}")
    reports = {t["number"]: _reports(client, t) for t in trials}
    return SearchRun(
        searcher=loaded["searcher"]["name"],
        seed=loaded["reproducibility"]["experiment_seed"],
        wall_s=float(exp["ended_at"]) - float(exp["created_at"]),
        reports=[r for number in sorted(reports) for r in reports[number]],
        hparams={t["number"]: t["hparams"] for t in trials},
        early_stopped=sum(bool(t["early_stopped"]) for t in trials),
        stop_steps={t["number"]: int(t["early_stop"]["step"]) for t in trials
                    if t["early_stopped"] and t["early_stop"]},
        verified=sum(bool((t.get("verification") or {}).get("passed")) for t in trials),
    )


def _reports(client: Client, trial: dict[str, Any]) -> list[Report]:
    rows = client.all_metrics(trial["id"], kind="validation")
    expect(bool(rows), f"trial {trial['id']} reported no validation")
    return [Report(trial["number"], int(r["step"]), float(r["time"]),
                   float(r["metrics"][METRIC])) for r in rows]


# -- the report ----------------------------------------------------------------------------------


def _outcome(size: Size, base: dict[str, Any], runs: dict[int, dict[str, SearchRun]]
             ) -> Outcome:
    results = []
    for seed, arms in runs.items():
        random, asha = arms["random"], arms["adaptive_asha"]
        expect(random.hparams == asha.hparams,
               f"seed {seed}: the arms drew different hyperparameters for the same trials")
        results.append(compare(seed, random.reports, asha.reports, asha.stop_steps))
    ratio = median([r.until_ratio(r.asha) for r in results])
    searcher = base["searcher"]
    trials = size.max_trials or searcher["max_trials"]
    length = size.max_length or searcher["max_length"]
    tables = [_until_table(results, ratio), _spent_table(results), _runs_table(runs)]
    target = Target(f"(s) epochs until a trial is within {WITHIN * 100:.1f} pp of random "
                    f"search's best {METRIC}: adaptive ASHA / random ≤ {TARGET_RATIO:.2f} "
                    "(median over seeds)", f"{ratio:.2f}", ratio <= TARGET_RATIO)
    notes = [f"{trials} trials of up to {length} epochs each, {searcher['max_concurrent_trials']}"
             f" at once, per arm and seed; ASHA: mode {searcher.get('mode', 'standard')}, "
             f"divisor {searcher.get('divisor', 4)}, max_rungs {searcher.get('max_rungs', 5)}.",
             "An epoch is counted once a trial reported validation for it; reports are "
             "ordered by the time the harness stamped them. \"at decision\": ASHA's reports "
             "cut at the step where the searcher decided each early stop, as if the stop took "
             "no time (the schedule is left as it was).",
             f"Identical curves: {_identical(runs)} of the validation reports that both arms "
             "made for the same trial and epoch have the same val_accuracy."]
    data = {"results": [asdict(r) for r in results],
            "runs": {str(seed): {name: asdict(run) for name, run in arms.items()}
                     for seed, arms in runs.items()}}
    return Outcome("search", tables, [target], notes, data)


def _until_table(results: list[SeedResult], ratio: float) -> Table:
    rows = [[str(r.seed), f"{r.target + WITHIN:.4f}", _reached(r.random), _reached(r.asha),
             f"{r.until_ratio(r.asha):.2f}", _reached(r.asha_at_decision),
             f"{r.until_ratio(r.asha_at_decision):.2f}"] for r in results]
    rows.append(["**median**", "", "", "", f"**{ratio:.2f}**", "",
                 f"{median([r.until_ratio(r.asha_at_decision) for r in results]):.2f}"])
    return Table(f"(s) epochs until a trial is within {WITHIN * 100:.1f} pp of random search's "
                 f"best {METRIC} (the trial #number and its epoch)",
                 ["seed", f"random's best {METRIC}", "random", "adaptive ASHA",
                  "ASHA / random", "ASHA at decision", "at decision / random"], rows)


def _spent_table(results: list[SeedResult]) -> Table:
    rows = [[str(r.seed), str(r.random.spent), str(r.asha.spent),
             f"{r.spent_ratio(r.asha):.2f}", str(r.asha_at_decision.spent),
             f"{r.spent_ratio(r.asha_at_decision):.2f}"] for r in results]
    spent = median([r.spent_ratio(r.asha) for r in results])
    rows.append(["**median**", "", "", f"**{spent:.2f}**", "",
                 f"{median([r.spent_ratio(r.asha_at_decision) for r in results]):.2f}"])
    return Table("(s) epochs trained in all", ["seed", "random", "adaptive ASHA",
                                               "ASHA / random", "ASHA at decision",
                                               "at decision / random"], rows)


def _reached(arm: Arm) -> str:
    if arm.reached is None:
        return "not reached"
    return f"{arm.reached.epochs} (#{arm.reached.report.trial}, {arm.reached.report.step})"


def _runs_table(runs: dict[int, dict[str, SearchRun]]) -> Table:
    rows = []
    for seed, arms in runs.items():
        for name, run in arms.items():
            over = run.overshoot()
            rows.append([str(seed), name, f"{run.wall_s:.0f}", f"{best_accuracy(run.reports):.4f}",
                         str(run.early_stopped),
                         f"{statistics.median(over):g}" if over else "-", str(run.verified)])
    return Table("(s) the runs", ["seed", "searcher", "wall s", f"best {METRIC}",
                                  "stopped early", "median epochs past the stop decision",
                                  "verification recorded and passed"], rows)


def _identical(runs: dict[int, dict[str, SearchRun]]) -> str:
    same = total = 0
    for arms in runs.values():
        random = {(r.trial, r.step): r.accuracy for r in arms["random"].reports}
        for r in arms["adaptive_asha"].reports:
            if (r.trial, r.step) in random:
                total += 1
                same += random[(r.trial, r.step)] == r.accuracy
    return f"{same:,} of {total:,}"
