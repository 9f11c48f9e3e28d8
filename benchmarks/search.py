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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


FULL = Size(seeds=(1, 2, 3), max_trials=None, max_length=None)
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
    overshoot: list[int]  # per early-stopped trial: epochs trained past the step judged
    verified: int  # trials whose verification was recorded and passed


# -- the measure (pure) ----------------------------------------------------------------------


def best_accuracy(reports: Iterable[Report]) -> float:
    return max(r.accuracy for r in reports)


def steps_spent(reports: Iterable[Report]) -> int:
    """Epochs trained in all: each trial's highest validation step, summed."""
    highest: dict[int, int] = {}
    for r in reports:
        highest[r.trial] = max(highest.get(r.trial, 0), r.step)
    return sum(highest.values())


def steps_until(reports: Iterable[Report], target: float) -> int | None:
    """Epochs all trials had completed (by the reports' times) when one first reported an
    accuracy of at least `target`; None if none did."""
    highest: dict[int, int] = {}
    for r in sorted(reports, key=lambda r: (r.time, r.trial, r.step)):
        highest[r.trial] = max(highest.get(r.trial, 0), r.step)
        if r.accuracy >= target:
            return sum(highest.values())
    return None


@dataclass(frozen=True)
class SeedResult:
    seed: int
    target: float
    random_until: int
    asha_until: int | None
    random_spent: int
    asha_spent: int

    @property
    def until_ratio(self) -> float:
        """ASHA / random epochs to the target; infinite when ASHA never reached it."""
        if self.asha_until is None:
            return float("inf")
        return self.asha_until / self.random_until

    @property
    def spent_ratio(self) -> float:
        return self.asha_spent / self.random_spent


def compare(seed: int, random_reports: Sequence[Report], asha_reports: Sequence[Report]
            ) -> SeedResult:
    """The two arms of one seed, by the measure in the module's docstring."""
    target = best_accuracy(random_reports) - WITHIN
    random_until = steps_until(random_reports, target)
    expect(random_until is not None, "random search never reached its own best")
    return SeedResult(seed, target, random_until, steps_until(asha_reports, target),
                      steps_spent(random_reports), steps_spent(asha_reports))


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
    stopped = [t for t in trials if t["early_stopped"] and t.get("early_stop")]
    return SearchRun(
        searcher=loaded["searcher"]["name"],
        seed=loaded["reproducibility"]["experiment_seed"],
        wall_s=float(exp["ended_at"]) - float(exp["created_at"]),
        reports=[r for number in sorted(reports) for r in reports[number]],
        hparams={t["number"]: t["hparams"] for t in trials},
        early_stopped=sum(bool(t["early_stopped"]) for t in trials),
        # epochs each trained after the step at which the searcher decided to stop it
        overshoot=[max(r.step for r in reports[t["number"]]) - int(t["early_stop"]["step"])
                   for t in stopped],
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
        results.append(compare(seed, random.reports, asha.reports))
    ratio = median([r.until_ratio for r in results])
    searcher = base["searcher"]
    trials = size.max_trials or searcher["max_trials"]
    length = size.max_length or searcher["max_length"]
    tables = [_measure_table(results, runs, ratio, trials, length), _runs_table(runs)]
    target = Target(f"(s) epochs until a trial is within {WITHIN * 100:.1f} pp of random "
                    f"search's best {METRIC}: adaptive ASHA / random ≤ {TARGET_RATIO:.2f} "
                    "(median over seeds)", f"{ratio:.2f}", ratio <= TARGET_RATIO)
    notes = [f"{trials} trials of up to {length} epochs each, {searcher['max_concurrent_trials']}"
             f" at once, per arm and seed; ASHA: mode {searcher.get('mode', 'standard')}, "
             f"divisor {searcher.get('divisor', 4)}, max_rungs {searcher.get('max_rungs', 5)}.",
             "An epoch is counted once a trial reported validation for it; reports are "
             "ordered by the time the harness stamped them.",
             f"Identical curves: {_identical(runs)} of the validation reports that both arms "
             "made for the same trial and epoch have the same val_accuracy."]
    data = {"results": [vars(r) | {"until_ratio": r.until_ratio, "spent_ratio": r.spent_ratio}
                        for r in results],
            "runs": {str(seed): {name: vars(run) | {"reports": [vars(r) for r in run.reports]}
                                 for name, run in arms.items()}
                     for seed, arms in runs.items()}}
    return Outcome("search", tables, [target], notes, data)


def _measure_table(results: list[SeedResult], runs: dict[int, dict[str, SearchRun]],
                   ratio: float, trials: int, length: int) -> Table:
    rows = []
    for r in results:
        best = best_accuracy(runs[r.seed]["random"].reports)
        rows.append([str(r.seed), f"{best:.4f}", str(r.random_until),
                     "not reached" if r.asha_until is None else str(r.asha_until),
                     f"{r.until_ratio:.2f}", str(r.random_spent), str(r.asha_spent),
                     f"{r.spent_ratio:.2f}"])
    rows.append(["**median**", "", "", "", f"**{ratio:.2f}**", "", "",
                 f"{median([r.spent_ratio for r in results]):.2f}"])
    return Table(f"(s) epochs of training, random search vs adaptive ASHA ({trials} trials of "
                 f"up to {length} epochs per arm)",
                 ["seed", "random's best val_accuracy", "random: epochs to within 0.5 pp",
                  "ASHA: epochs to within 0.5 pp", "ASHA / random", "random: epochs in all",
                  "ASHA: epochs in all", "ASHA / random"], rows)


def _runs_table(runs: dict[int, dict[str, SearchRun]]) -> Table:
    rows = []
    for seed, arms in runs.items():
        for name, run in arms.items():
            over = (f"{statistics.median(run.overshoot):g}" if run.overshoot else "-")
            rows.append([str(seed), name, f"{run.wall_s:.0f}", f"{best_accuracy(run.reports):.4f}",
                         str(run.early_stopped), over, str(run.verified)])
    return Table("(s) the runs", ["seed", "searcher", "wall s", "best val_accuracy",
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
