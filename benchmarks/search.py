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

`run.py --only search` runs search.yaml's budget and ASHA settings (`FULL`, `--quick`:
`QUICK`). The study of issue 19 runs from here: `python benchmarks/search.py --study` runs
64 trials of up to 64 epochs per arm and seed (seeds 1-5) with a searcher block that sets
only the metric and the budget (`max_trials`, `max_length`), so that ASHA's own settings
(mode, divisor, max_rungs) and `max_concurrent_trials` are muster's defaults, the ones a
user who writes no more gets (`--study --quick`: 1 seed, 8 trials of up to 16 epochs).
`--variant divisor=3` adds an adaptive ASHA arm with those settings over the same block, run
on the same trials; `--seeds`, `--trials`, `--max-length` and `--slots` change the size.
`--from results.json ...` shows earlier runs' results together (a study run a seed at a
time) without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from math import inf
from pathlib import Path
from typing import Any

import yaml
from measure import expect, median
from muster_server import ServerProcess
from report import Outcome, Table, Target, describe_machine, render_markdown, write_json

from muster.client import Client
from muster.config import load_config
from muster.search.adaptive_asha import AdaptiveAsha
from muster.search.asha import Asha
from muster.search.searchers import searcher_for

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"
SEARCH_YAML = DIGITS / "search.yaml"
METRIC = "val_accuracy"
WITHIN = 0.005  # 0.5 percentage points of random search's best
TARGET_RATIO = 0.40
POLL_S = 1.0
TIMEOUT_S = 1800.0  # per search; at least TIMEOUT_PER_TRIAL_S per trial
TIMEOUT_PER_TRIAL_S = 60.0
SLOTS = 2
ARMS = ("random", "adaptive_asha")
ASHA_ONLY = ("mode", "divisor", "max_rungs")  # settings the random searcher refuses
ASHAS = ("asha", "adaptive_asha")  # random draws: trial N as random search's trial N
# `--searcher`: the other searchers an arm may run (issue 38's "every searcher").
OTHER_SEARCHERS = ("tpe", "asha", "bohb", "nsga2", "pbt")
# A PBT arm's budget: up to 4 rounds of max_length / rounds, as many members as that leaves
# of max_trials, at least 4 (a quarter of fewer would replace none).
PBT_ROUNDS, PBT_MIN_POPULATION = 4, 4
# What a PBT member explores: `hidden` is the layer's width, which copied weights fix.
PBT_EXPLORED = ["lr", "dropout", "batch_size"]
# What a config must set for an ASHA search (and the metric's direction): a searcher block
# of these alone leaves every other setting at muster's default.
REQUIRED = ("name", "metric", "smaller_is_better", "max_trials", "max_length")
OUT_DIR = ROOT / "benchmarks" / "out" / "search"


@dataclass(frozen=True)
class Size:
    seeds: tuple[int, ...]
    max_trials: int | None  # None: search.yaml's
    max_length: int | None
    # True: the searcher block keeps only REQUIRED (ASHA's settings and max_concurrent_trials
    # at muster's defaults); False: search.yaml's block as written.
    defaults: bool = False


FULL = Size(seeds=(1, 2, 3, 4, 5), max_trials=None, max_length=None)
QUICK = Size(seeds=(1,), max_trials=6, max_length=16)
# Issue 19's study: a budget where early stopping matters, at the defaults a user gets.
STUDY = Size(seeds=(1, 2, 3, 4, 5), max_trials=64, max_length=64, defaults=True)
STUDY_QUICK = Size(seeds=(1,), max_trials=8, max_length=16, defaults=True)


@dataclass(frozen=True)
class ArmSpec:
    """One arm: a searcher, and settings over the searcher block (an ASHA variant)."""

    searcher: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join([self.searcher, *(f"{k}={v}" for k, v in self.settings.items())])


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
    # by trial number: the epochs it started from, trained by another trial (a PBT
    # member's parent's: its first report's step - 1); none for any other searcher
    starts: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearchRun:
        """A SearchRun from its JSON (a study's saved file, whose mappings have string
        keys)."""
        return cls(
            searcher=data["searcher"], seed=data["seed"], wall_s=data["wall_s"],
            reports=[Report(**r) for r in data["reports"]],
            hparams={int(k): v for k, v in data["hparams"].items()},
            early_stopped=data["early_stopped"],
            stop_steps={int(k): v for k, v in data["stop_steps"].items()},
            verified=data["verified"],
            starts={int(k): v for k, v in data.get("starts", {}).items()})

    def overshoot(self) -> list[int]:
        """Per early-stopped trial, the epochs it trained after the searcher's decision."""
        return [steps_spent([r for r in self.reports if r.trial == number]) - step
                for number, step in self.stop_steps.items()]


# -- the measure (pure) ----------------------------------------------------------------------


def best_accuracy(reports: Iterable[Report]) -> float:
    return max(r.accuracy for r in reports)


def steps_spent(reports: Iterable[Report], starts: Mapping[int, int] | None = None) -> int:
    """Epochs trained in all: each trial's highest validation step, summed, less the epochs
    it started from (`starts`: a PBT member's are its parent's, by trial number)."""
    highest: dict[int, int] = {}
    for r in reports:
        highest[r.trial] = max(highest.get(r.trial, 0), r.step)
    return sum(step - (starts or {}).get(trial, 0) for trial, step in highest.items())


def stopped_at_decision(reports: Iterable[Report], stop_steps: Mapping[int, int]
                        ) -> list[Report]:
    """The reports as they would be had each stopped trial stopped at the step where the
    searcher decided to stop it (its later epochs are the latency of the stop)."""
    return [r for r in reports if r.step <= stop_steps.get(r.trial, r.step)]


@dataclass(frozen=True)
class Reached:
    report: Report  # the first report at or above the target
    epochs: int  # epochs all trials had completed by then


def first_reaching(reports: Iterable[Report], target: float,
                   starts: Mapping[int, int] | None = None) -> Reached | None:
    """The first report (by time) with an accuracy of at least `target`, and the epochs all
    trials had completed by then (less `starts`, as `steps_spent`); None if no report
    reached it."""
    highest: dict[int, int] = {}
    for r in sorted(reports, key=lambda r: (r.time, r.trial, r.step)):
        highest[r.trial] = max(highest.get(r.trial, 0), r.step)
        if r.accuracy >= target:
            return Reached(r, sum(step - (starts or {}).get(trial, 0)
                                  for trial, step in highest.items()))
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
            asha_stop_steps: Mapping[int, int], asha_starts: Mapping[int, int] | None = None
            ) -> SeedResult:
    """The two arms of one seed, by the measure in the module's docstring (`asha_starts`:
    the epochs each of the other arm's trials started from, a PBT member's parent's)."""
    target = best_accuracy(random_reports) - WITHIN
    cut = stopped_at_decision(asha_reports, asha_stop_steps)
    return SeedResult(seed, target, _arm(random_reports, target),
                      _arm(asha_reports, target, asha_starts), _arm(cut, target, asha_starts))


def _arm(reports: Sequence[Report], target: float,
         starts: Mapping[int, int] | None = None) -> Arm:
    return Arm(first_reaching(reports, target, starts), steps_spent(reports, starts))


# -- the runs ----------------------------------------------------------------------------------


def run(quick: bool) -> Outcome:
    return study(QUICK if quick else FULL)


def study(size: Size, variants: Sequence[ArmSpec] = (), slots: int = SLOTS) -> Outcome:
    """Every arm once per seed on one server, rotating which arm goes first."""
    base = yaml.safe_load(SEARCH_YAML.read_text())
    arms = [ArmSpec(name) for name in ARMS] + list(variants)
    labels = [arm.label for arm in arms]
    expect(len(set(labels)) == len(labels), f"two arms are the same: {labels}")
    runs: dict[int, dict[str, SearchRun]] = {}
    with tempfile.TemporaryDirectory(prefix="muster-bench-search-") as tmp:
        root = Path(tmp)
        context = _context(root / "context")
        with ServerProcess(root / "server", slots=slots) as server, server.client() as client:
            for i, seed in enumerate(size.seeds):
                shift = i % len(arms)  # who goes first rotates
                runs[seed] = {arm.label: _search(client, context, _config(
                    base, arm.searcher, seed, size, arm.settings))
                    for arm in arms[shift:] + arms[:shift]}
    configs = {arm.label: _config(base, arm.searcher, size.seeds[0], size, arm.settings)
               for arm in arms}
    return _outcome(size, configs, runs, slots)


def _context(context: Path) -> Path:
    """train.py and the digits data, as one upload."""
    context.mkdir(parents=True)
    shutil.copy(DIGITS / "train.py", context)
    subprocess.run([sys.executable, str(DIGITS / "prepare_data.py"), "--out",
                    str(context / "data")], check=True, capture_output=True)
    return context


def _config(base: dict[str, Any], searcher: str, seed: int, size: Size,
            settings: Mapping[str, Any] | None = None) -> str:
    """The experiment config of one arm and seed: search.yaml with its searcher block (only
    REQUIRED of it when `size.defaults`) set to `searcher`, `settings` over it."""
    settings = settings or {}
    slug = "-".join([searcher, *(f"{k}-{v}" for k, v in settings.items())])
    config = {**base, "name": f"bench-search-{slug}-seed-{seed}"}
    block = {k: v for k, v in base["searcher"].items() if not size.defaults or k in REQUIRED}
    block = {**block, "name": searcher, **settings}
    if searcher not in (*ASHAS, "bohb"):
        block = {k: v for k, v in block.items() if k not in ASHA_ONLY}
    if size.max_trials is not None:
        block["max_trials"] = size.max_trials
    if size.max_length is not None:
        block["max_length"] = size.max_length
    if searcher == "pbt":  # the same budget: max_trials rounds of max_length in all
        trials, length = block.pop("max_trials"), block.pop("max_length")
        rounds = max(1, min(PBT_ROUNDS, trials // PBT_MIN_POPULATION))
        block |= {"population_size": max(2, trials // rounds), "num_rounds": rounds,
                  "length_per_round": max(1, length // rounds),
                  "explore_function": {"hyperparameters": PBT_EXPLORED}}
    config["searcher"] = block
    config["reproducibility"] = {**base.get("reproducibility", {}), "experiment_seed": seed}
    return yaml.safe_dump(config, sort_keys=False)


def _search(client: Client, context: Path, config: str) -> SearchRun:
    """Run one search to its end; its trials' validation reports and how they ended."""
    loaded = yaml.safe_load(config)
    print(f"  {loaded['name']}", file=sys.stderr, flush=True)
    exp = client.create_experiment(config, context)
    planned = load_config(config).trial_count()
    deadline = time.monotonic() + max(TIMEOUT_S, TIMEOUT_PER_TRIAL_S * planned)
    while exp["state"] in ("ACTIVE", "PAUSED"):
        expect(time.monotonic() < deadline, f"experiment {exp['id']} did not end")
        time.sleep(POLL_S)
        exp = client.get_experiment(exp["id"])
    expect(exp["state"] == "COMPLETED", f"experiment {exp['id']} ended {exp['state']}")
    trials = exp["trials"]
    expect(len(trials) == planned, f"experiment {exp['id']} ran {len(trials)} trials")
    for trial in trials:
        expect(trial["state"] == "SUCCEEDED",
               f"trial {trial['id']} ended {trial['state']}: {trial['message']}")
    reports = {t["number"]: _reports(client, t) for t in trials}
    print(f"    {len(trials)} trials, {float(exp['ended_at']) - float(exp['created_at']):.0f} s",
          file=sys.stderr, flush=True)
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
        starts=({number: min(r.step for r in rows) - 1 for number, rows in reports.items()}
                if loaded["searcher"]["name"] == "pbt" else {}),
    )


def _reports(client: Client, trial: dict[str, Any]) -> list[Report]:
    rows = client.all_metrics(trial["id"], kind="validation")
    expect(bool(rows), f"trial {trial['id']} reported no validation")
    return [Report(trial["number"], int(r["step"]), float(r["time"]),
                   float(r["metrics"][METRIC])) for r in rows]


# -- the report ----------------------------------------------------------------------------------


def _outcome(size: Size, configs: Mapping[str, str], runs: dict[int, dict[str, SearchRun]],
             slots: int = SLOTS) -> Outcome:
    """The tables: per ASHA arm (adaptive_asha and any variant), each seed against random."""
    ashas = [label for label in configs if label != "random"]
    results: dict[str, list[SeedResult]] = {label: [] for label in ashas}
    for seed, arms in runs.items():
        random = arms["random"]
        for label in ashas:
            asha = arms[label]
            expect(asha.searcher not in ASHAS or random.hparams == asha.hparams,
                   f"seed {seed}: {label} drew different hyperparameters than random for the "
                   "same trials")
            results[label].append(compare(seed, random.reports, asha.reports, asha.stop_steps,
                                          asha.starts))
    main = results["adaptive_asha"]
    ratio = median([r.until_ratio(r.asha) for r in main])
    tables = []
    for label in ashas:
        named = "" if len(ashas) == 1 else f": {label}"
        arm = "adaptive ASHA" if label == "adaptive_asha" else label
        tables += [_until_table(results[label], named, arm),
                   _spent_table(results[label], named, arm)]
    tables += [_summary_table(results, runs), _runs_table(runs)]
    target = Target(f"(s) epochs until a trial is within {WITHIN * 100:.1f} pp of random "
                    f"search's best {METRIC}: adaptive ASHA / random ≤ {TARGET_RATIO:.2f} "
                    "(median over seeds)", f"{ratio:.2f}", ratio <= TARGET_RATIO)
    searcher = load_config(configs["random"]).searcher
    where = "muster's defaults" if size.defaults else "search.yaml's"
    notes = [f"{searcher.max_trials} trials of up to {searcher.max_length} epochs each per arm "
             f"and seed, {searcher.max_concurrent_trials} at once ({where}) on a server with "
             f"{slots} slots.",
             *(f"{label}: {_schedule(configs[label])}" for label in ashas),
             "Only the asha arms draw trial N as random search does; tpe, bohb and nsga2 "
             "learn from the results, and pbt draws its first generation as random's first "
             "trials and then continues and copies members, an epoch of a member counted "
             "once (its parent's epochs are its parent's).",
             "An epoch is counted once a trial reported validation for it; reports are "
             "ordered by the time the harness stamped them. \"at decision\": ASHA's reports "
             "cut at the step where the searcher decided each early stop, as if the stop took "
             "no time (the schedule is left as it was).",
             f"Identical curves: {_identical(runs)} of the validation reports that an ASHA arm "
             "and random search made for the same trial and epoch have the same val_accuracy."]
    data = {"size": asdict(size), "slots": slots, "configs": dict(configs),
            "results": {label: [asdict(r) for r in rs] for label, rs in results.items()},
            "runs": {str(seed): {name: asdict(run) for name, run in arms.items()}
                     for seed, arms in runs.items()}}
    return Outcome("search", tables, [target], notes, data)


def _schedule(config: str) -> str:
    """Where an ASHA arm's searcher judges: its settings, brackets, rungs and each bracket's
    share of the trials (Optuna's HyperbandPruner draws a trial's bracket in proportion to
    ceil(B * divisor**s / (s + 1)), s = B - 1 - bracket)."""
    loaded = load_config(config)
    searcher, settings = searcher_for(loaded, 0), loaded.searcher
    if settings.name == "pbt":
        return (f"pbt, {settings.population_size} members, {settings.num_rounds} rounds of "
                f"{settings.length_per_round} epochs, the worst "
                f"{settings.replace_function.truncate_fraction:g} replaced, exploring "
                f"{', '.join(settings.explore_function.hyperparameters or ['every one'])}.")
    if not isinstance(searcher, Asha):
        return f"{settings.name}, {settings.max_trials} trials of {settings.max_length} epochs."
    assert settings.max_length is not None
    low, divisor = searcher.min_resource(), settings.divisor
    count = searcher.brackets() if isinstance(searcher, AdaptiveAsha) else 1
    weights = [math.ceil(count * divisor ** (count - 1 - b) / (count - b)) for b in range(count)]
    brackets = []
    for b, weight in enumerate(weights):
        rungs, step = [], low * divisor ** b
        while step < settings.max_length:  # a report at max_length is not judged
            rungs.append(step)
            step *= divisor
        judged = f"judged at epochs {', '.join(map(str, rungs))}" if rungs else "never judged"
        brackets.append(f"{100 * weight / sum(weights):.0f}% {judged}")
    mode = f"mode {settings.mode}, " if isinstance(searcher, AdaptiveAsha) else ""
    return (f"{settings.name}, {mode}divisor {divisor}, max_rungs {settings.max_rungs}: "
            f"first rung at epoch {low}, {count} bracket{'s' if count > 1 else ''} "
            f"({'; '.join(brackets)}).")


def _until_table(results: list[SeedResult], named: str = "", arm: str = "adaptive ASHA"
                 ) -> Table:
    ratio = median([r.until_ratio(r.asha) for r in results])
    rows = [[str(r.seed), f"{r.target + WITHIN:.4f}", _reached(r.random), _reached(r.asha),
             f"{r.until_ratio(r.asha):.2f}", _reached(r.asha_at_decision),
             f"{r.until_ratio(r.asha_at_decision):.2f}"] for r in results]
    rows.append(["**median**", "", "", "", f"**{ratio:.2f}**", "",
                 f"{median([r.until_ratio(r.asha_at_decision) for r in results]):.2f}"])
    return Table(f"(s) epochs until a trial is within {WITHIN * 100:.1f} pp of random search's "
                 f"best {METRIC} (the trial #number and its epoch){named}",
                 ["seed", f"random's best {METRIC}", "random", arm,
                  f"{arm} / random", f"{arm} at decision", "at decision / random"], rows)


def _spent_table(results: list[SeedResult], named: str = "", arm: str = "adaptive ASHA"
                 ) -> Table:
    rows = [[str(r.seed), str(r.random.spent), str(r.asha.spent),
             f"{r.spent_ratio(r.asha):.2f}", str(r.asha_at_decision.spent),
             f"{r.spent_ratio(r.asha_at_decision):.2f}"] for r in results]
    spent = median([r.spent_ratio(r.asha) for r in results])
    rows.append(["**median**", "", "", f"**{spent:.2f}**", "",
                 f"{median([r.spent_ratio(r.asha_at_decision) for r in results]):.2f}"])
    return Table(f"(s) epochs trained in all{named}", ["seed", "random", arm,
                                                       f"{arm} / random", f"{arm} at decision",
                                                       "at decision / random"], rows)


def _summary_table(results: Mapping[str, list[SeedResult]],
                   runs: dict[int, dict[str, SearchRun]]) -> Table:
    """Per arm, medians over the seeds."""
    seeds = len(runs)
    first = next(iter(results.values()))
    rows = [["random", f"{median([r.random.reached.epochs for r in first if r.random.reached]):g}",
             "1.00", f"{seeds} of {seeds}", f"{median([r.random.spent for r in first]):g}",
             "1.00", _best(runs, "random")]]
    for label, rs in results.items():
        reached = [r.asha.reached.epochs for r in rs if r.asha.reached]
        rows.append([label, f"{median(reached):g}" if reached else "-",
                     f"{median([r.until_ratio(r.asha) for r in rs]):.2f}",
                     f"{len(reached)} of {len(rs)}", f"{median([r.asha.spent for r in rs]):g}",
                     f"{median([r.spent_ratio(r.asha) for r in rs]):.2f}", _best(runs, label)])
    return Table(f"(s) medians over {seeds} seed{'s' if seeds > 1 else ''}",
                 ["arm", "epochs to within reach (median of the seeds that got there)",
                  "/ random",
                  "seeds that reached it", "epochs in all", "/ random",
                  f"best {METRIC} (range)"], rows)


def _best(runs: dict[int, dict[str, SearchRun]], label: str) -> str:
    best = [best_accuracy(arms[label].reports) for arms in runs.values()]
    return f"{median(best):.4f} ({min(best):.4f} to {max(best):.4f})"


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
        for run in arms.values():
            if run.searcher in ASHAS:
                agreed, shared = agreeing(arms["random"].reports, run.reports)
                same, total = same + agreed, total + shared
    return f"{same:,} of {total:,}"


def agreeing(random: Iterable[Report], reports: Iterable[Report]) -> tuple[int, int]:
    """Of `reports`, how many have the same accuracy as random search's report of the same
    trial and step, and how many such reports there are: arms that share trials and data
    differ only by their searcher when every shared report agrees."""
    by_step = {(r.trial, r.step): r.accuracy for r in random}
    shared = [r for r in reports if (r.trial, r.step) in by_step]
    return sum(by_step[(r.trial, r.step)] == r.accuracy for r in shared), len(shared)


# -- the study, from the command line -----------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", action="store_true",
                        help="issue 19's study: 64 trials of up to 64 epochs, seeds 1-5, ASHA "
                             "and max_concurrent_trials at muster's defaults")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, few trials")
    parser.add_argument("--seeds", type=int, nargs="+", help="experiment seeds to run")
    parser.add_argument("--trials", type=int, help="max_trials per arm and seed")
    parser.add_argument("--max-length", type=int, help="max_length (epochs)")
    parser.add_argument("--slots", type=int, default=SLOTS, help="the server's slots")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE,...",
                        help="an extra adaptive_asha arm with these searcher settings, e.g. "
                             "divisor=3 or max_rungs=3,mode=conservative (repeatable)")
    parser.add_argument("--searcher", action="append", default=[], choices=OTHER_SEARCHERS,
                        help="an extra arm of this searcher over the same block and budget "
                             "(pbt: up to 4 rounds of max_length / rounds, max_trials / rounds "
                             "members, at least 4; repeatable)")
    parser.add_argument("--from", dest="sources", nargs="+", type=Path, metavar="JSON",
                        help="show the seeds of these results files (benchmarks/out/search/) "
                             "together instead of running")
    args = parser.parse_args(argv)
    command = shlex.join([Path(sys.executable).name, "benchmarks/search.py",
                          *(sys.argv[1:] if argv is None else argv)])
    if args.sources:
        machine, outcome = merged(args.sources)
        print(render_markdown(machine, [outcome], command), end="")
        return 0
    size = (STUDY_QUICK if args.quick else STUDY) if args.study else (QUICK if args.quick
                                                                      else FULL)
    size = replace(size, seeds=tuple(args.seeds or size.seeds),
                   max_trials=args.trials or size.max_trials,
                   max_length=args.max_length or size.max_length)
    variants = [ArmSpec(name) for name in args.searcher]
    variants += [ArmSpec("adaptive_asha", _settings(text)) for text in args.variant]
    machine = describe_machine()
    started, load_before = time.monotonic(), os.getloadavg()[0]
    outcome = study(size, variants, args.slots)
    load_after = os.getloadavg()[0]
    outcome.notes.append(f"1-minute load average {load_before:.1f} at the start, "
                         f"{load_after:.1f} at the end ({os.cpu_count()} CPUs); the study took "
                         f"{time.monotonic() - started:.0f} s.")
    outcome.data["load_average"] = [load_before, load_after]
    outcome.data["wall_s"] = time.monotonic() - started
    print(render_markdown(machine, [outcome], command), end="")
    print(f"results: {write_json(OUT_DIR, machine, [outcome], command)}", file=sys.stderr)
    return 0


def _settings(text: str) -> dict[str, Any]:
    """`divisor=3,mode=conservative` as {"divisor": 3, "mode": "conservative"}."""
    settings = {}
    for item in text.split(","):
        key, equals, value = item.partition("=")
        if not equals or key.strip() not in (*ASHA_ONLY, "max_concurrent_trials"):
            raise SystemExit(f"--variant {text!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(ASHA_ONLY)}, max_concurrent_trials")
        settings[key.strip()] = yaml.safe_load(value)
    return settings


def merged(paths: Sequence[Path]) -> tuple[dict[str, Any], Outcome]:
    """The seeds of several results files as one outcome (the same arms in each), and the
    first file's machine."""
    runs: dict[int, dict[str, SearchRun]] = {}
    first: dict[str, Any] = {}
    notes = []
    for path in paths:
        document = json.loads(path.read_text())
        data = document["benchmarks"]["search"]["data"]
        first = first or {**data, "machine": document["machine"]}
        expect(_blocks(data["configs"]) == _blocks(first["configs"]),
               f"{path} ran other arms than {paths[0]}")
        for seed, arms in data["runs"].items():
            expect(int(seed) not in runs, f"seed {seed} is in two of the files")
            runs[int(seed)] = {label: SearchRun.from_json(run) for label, run in arms.items()}
        load, wall = data.get("load_average", [math.nan] * 2), data.get("wall_s")
        notes.append(f"{path.name}: seed{'s' if len(data['runs']) > 1 else ''} "
                     f"{', '.join(data['runs'])}, commit {document['machine']['git_commit']}"
                     f"{' + local changes in src/' if document['machine']['src_modified'] else ''}"
                     f", 1-minute load average {load[0]:.1f} at the start and {load[1]:.1f} at "
                     f"the end" + (f", {wall:.0f} s" if wall is not None else "") + ".")
    size = replace(Size(**{**first["size"], "seeds": ()}), seeds=tuple(sorted(runs)))
    outcome = _outcome(size, first["configs"], {seed: runs[seed] for seed in size.seeds},
                       first["slots"])
    outcome.notes += notes
    return first["machine"], outcome


def _blocks(configs: Mapping[str, str]) -> dict[str, Any]:
    return {label: yaml.safe_load(config)["searcher"] for label, config in configs.items()}


if __name__ == "__main__":
    sys.exit(main())
