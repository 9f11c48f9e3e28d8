"""(s2) Search against Ray Tune: benchmarks/search.py's study of the digits example, with Ray
Tune's ASHA, BOHB and random search beside muster's, by the same measure.

muster's side is search.py's study, read from its results files (`--muster-results`, the
JSON that `search.py --study ... --searcher asha --searcher bohb` writes) or run here
(`--run-muster`): random search, adaptive ASHA, ASHA and BOHB over examples/digits/
search.yaml's space on a 2-slot server, each trial a `train.py` process. Ray Tune's side runs
each seed's arms, one after the other, each in a fresh local Ray of 2 CPUs
(`ray.init(num_cpus=2)`, in a loopback-only network namespace, as tune_peer.py does), one
CPU a trial, so 2 trials at once, with the same budget (max_trials, max_length epochs):

- `random`: FIFO over muster random search's trials of the same seed (their hyperparameters
  by trial number, as `points_to_evaluate`), so every trial learns the curve it learned there;
- `asha`: `ASHAScheduler` over the same trials, with the settings of muster's: `grace_period`
  its first rung, `reduction_factor` its divisor, `max_t` max_length, 1 bracket;
- `adaptive_asha`: the same with as many brackets as muster's adaptive ASHA has (Tune draws
  a trial's bracket at random, the earliest most often, as Optuna's HyperbandPruner does);
- `bohb`: `TuneBOHB` (hpbandster's model, its own draws) with `HyperBandForBOHB` (`max_t`
  max_length, `reduction_factor` the divisor), which pauses trials at its rungs and resumes
  the promoted ones from their checkpoints.

A Tune trial trains as train.py does, with its functions (`load_images`, `split`,
`make_model`, `train_epoch`, `validate`) and its seed, the MUSTER_SEED of trial N of the
experiment seed (N: the order the searcher drew it in); it reports val_accuracy with
`tune.report` once an epoch, with that epoch's checkpoint. The measure is search.py's
(`compare`: `first_reaching`, `steps_spent`): Tune's per-epoch results become its `Report`s,
and every arm is set against muster random search of the same seed (the target: its best
val_accuracy less 0.5 pp; the epochs it took, and spent) and against Tune's random arm.
Wall time is each search's (Tune: `Tuner.fit()`, `ray.init` apart; muster: created → ended)
and, as in search.py, not the measure.

    .venv-bench-ray/bin/python benchmarks/tune_search.py --muster-results RESULTS.json ...

`--seeds` runs some of the muster results' seeds; `--from` shows earlier runs of this script
(a seed at a time) together beside `--muster-results`, without running anything. Needs root
(the namespace), Ray Tune, hpbandster and ConfigSpace: `make bench-tune-search`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from measure import expect, median
from report import Outcome, Table, describe_machine, render_markdown, write_json
from tune_peer import loopback_namespace, tune_missing

from muster.config import load_config
from muster.config.space import Categorical, Double, Int, Log
from muster.search.adaptive_asha import AdaptiveAsha
from muster.search.history import trial_seed
from muster.search.searchers import searcher_for
from search import (
    DIGITS,
    METRIC,
    WITHIN,
    ArmSpec,
    Reached,
    Report,
    SearchRun,
    Size,
    agreeing,
    best_accuracy,
    compare,
    merged,
    steps_spent,
    study,
)

HERE = Path(__file__).resolve().parent
NAMESPACE = "muster-bench-tune-search"
OUT_DIR = HERE / "out" / "tune_search"
TUNE_ARMS = ("random", "asha", "adaptive_asha", "bohb")
MUSTER_ARMS = ("random", "adaptive_asha", "asha", "bohb")  # the ones Tune's arms stand beside
MUSTER_ARMS_RUN = [ArmSpec("asha"), ArmSpec("bohb")]  # `--run-muster`: beside random, adaptive
TIMEOUT_PER_TRIAL_S, TIMEOUT_S = 60.0, 1800.0  # per Tune search, as search.py's per search
STATE = "state.pt"  # a Tune trial's checkpoint file
TUNE_LOAD = "Tune's side:"  # how the note of a run's load average begins


# -- Tune's results as the measure's reports (pure) --------------------------------------------


@dataclass(frozen=True)
class Run:
    """One arm of one seed, muster's or Tune's, as the measure reads it."""

    reports: list[Report]
    stop_steps: dict[int, int]  # by trial number: the epoch at which the searcher stopped it
    starts: dict[int, int]  # by trial number: epochs trained by another trial (PBT only)
    wall_s: float


def reports_from(rows: Iterable[Mapping[str, Any]]) -> list[Report]:
    """Tune's per-epoch results (the trainable's `number`, `epoch`, `reported_at` and
    val_accuracy) as Reports, in time order. A result Tune hands on twice (a trial's last,
    again when it ends) counts once."""
    seen: dict[tuple[int, int], Report] = {}
    for row in rows:
        report = Report(int(row["number"]), int(row["epoch"]), float(row["reported_at"]),
                        float(row[METRIC]))
        seen.setdefault((report.trial, report.step), report)
    return sorted(seen.values(), key=lambda r: (r.time, r.trial, r.step))


def stopped_early(reports: Iterable[Report], max_length: int) -> dict[int, int]:
    """By trial number, the last epoch of each trial that ended before `max_length`: Tune's
    schedulers stop a trial on the result it judged, so that epoch is the decision's."""
    highest: dict[int, int] = {}
    for r in reports:
        highest[r.trial] = max(highest.get(r.trial, 0), r.step)
    return {trial: step for trial, step in highest.items() if step < max_length}


def tune_run(rows: Iterable[Mapping[str, Any]], max_length: int, wall_s: float) -> Run:
    reports = reports_from(rows)
    return Run(reports, stopped_early(reports, max_length), {}, wall_s)


def muster_run(run: SearchRun) -> Run:
    return Run(run.reports, run.stop_steps, run.starts, run.wall_s)


# -- what each Tune search runs (pure) ----------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """muster's budget and ASHA settings, in Tune's words: `grace_period` is muster's first
    rung, `reduction_factor` its divisor, `brackets` adaptive ASHA's count of them."""

    trials: int
    max_length: int
    grace_period: int
    reduction_factor: int
    brackets: int


def budget(configs: Mapping[str, str]) -> Budget:
    """The budget of muster's study of `configs`, from its adaptive ASHA arm (whose first
    bracket is plain ASHA, over the same rungs)."""
    asha = searcher_for(load_config(configs["adaptive_asha"]), 0)
    assert isinstance(asha, AdaptiveAsha), "search.py's study names adaptive_asha so"
    assert asha.config.max_length is not None, "checked by SearcherConfig"
    assert asha.config.max_trials is not None, "set by search.py's study"
    return Budget(asha.config.max_trials, asha.config.max_length, asha.min_resource(),
                  asha.config.divisor, asha.brackets())


@dataclass(frozen=True)
class FitSpec:
    """One Tune search: an arm of one seed, as the process in the namespace runs it."""

    arm: str
    seed: int
    trials: int
    max_length: int
    grace_period: int
    reduction_factor: int
    brackets: int  # ASHAScheduler's
    config: str  # muster's experiment config of the random arm: the space
    data: str  # the digits PNGs
    # muster random search's trials, by number ("number" included); empty: Tune draws them
    points: list[dict[str, Any]]


def plan(arm: str, seed: int, configs: Mapping[str, str], random: SearchRun, data: Path
         ) -> FitSpec:
    """The Tune search of `arm` beside muster's study of `configs` (`budget`), over the
    trials of muster's `random` search of the seed unless it draws its own (BOHB)."""
    expect(arm in TUNE_ARMS, f"no Tune arm {arm!r}; there are {', '.join(TUNE_ARMS)}")
    b = budget(configs)
    points = [] if arm == "bohb" else [{**random.hparams[number], "number": number}
                                       for number in sorted(random.hparams)]
    return FitSpec(arm, seed, b.trials, b.max_length, b.grace_period, b.reduction_factor,
                   b.brackets if arm == "adaptive_asha" else 1, configs["random"], str(data),
                   points)


def hyperband_brackets(max_t: int, reduction_factor: int) -> list[tuple[int, int]]:
    """The brackets of Tune's HyperBandForBOHB, in the order it fills them (the most eager
    first), as (trials, first rung): bracket s of s_max = round(log(max_t) / log(eta)) takes
    ceil((s_max + 1) / (s + 1) * eta**s) trials from epoch max_t / eta**s."""
    s_max = round(math.log(max_t) / math.log(reduction_factor))
    return [(math.ceil((s_max + 1) / (s + 1) * reduction_factor**s),
             max_t // reduction_factor**s) for s in range(s_max, -1, -1)]


# -- the Tune side, in the namespace (Ray imported here only) -----------------------------------


class _Samples:
    def seen(self, count: int, epoch: int) -> None:
        """A Tune trial counts no samples (muster's verification is not part of it)."""


class _NoHarness:
    """What train.py's `train_epoch` asks of muster's harness context, doing nothing: a Tune
    trial reports through `tune.report`, once an epoch."""

    samples = _Samples()

    def report_training(self, step: int, metrics: Mapping[str, float]) -> None:
        """Training loss is not reported (nor read by any searcher here)."""


def train_trial(config: dict[str, Any], data: tuple[Any, ...], max_length: int,
                seed: int) -> None:
    """One Tune trial: train.py's training of `config` for up to `max_length` epochs (from
    its checkpoint, when HyperBand resumes it), val_accuracy and a checkpoint each epoch."""
    import torch
    from train import Settings, make_model, train_epoch, validate

    from ray import tune

    torch.set_num_threads(1)  # OMP_NUM_THREADS=1, as search.yaml sets for train.py
    number = int(config["number"])
    expect(number >= 0, f"trial {tune.get_context().get_trial_id()} has no number")
    # MUSTER_SEED of trial `number` (muster.supervise.searching.trial_seed).
    run = Settings(lr=float(config["lr"]), hidden=int(config["hidden"]),
                   dropout=float(config["dropout"]), batch_size=int(config["batch_size"]),
                   epochs=max_length, seed=trial_seed(seed, number) % 2**31,
                   epoch_is_step=True)
    x_train, y_train, x_val, y_val = data
    torch.manual_seed(run.seed)
    model = make_model(run.hidden, run.dropout)
    optimizer = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)
    start, step = 1, 0
    if (checkpoint := tune.get_checkpoint()) is not None:
        with checkpoint.as_directory() as where:
            state = torch.load(Path(where) / STATE)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, step = state["epoch"] + 1, state["step"]
    for epoch in range(start, run.epochs + 1):
        step, _ = train_epoch(_NoHarness(), run, epoch, step, model, optimizer,
                              (x_train, y_train))
        val_loss, accuracy = validate(model, x_val, y_val)
        reported_at = time.time()  # as the harness stamps a report, before the checkpoint
        with tempfile.TemporaryDirectory() as saved:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "step": step}, Path(saved) / STATE)
            tune.report({"number": number, "epoch": epoch, METRIC: accuracy,
                         "val_loss": val_loss, "reported_at": reported_at},
                        checkpoint=tune.Checkpoint.from_directory(saved))
        expect(math.isfinite(val_loss), f"training diverged at epoch {epoch}")  # train.py: 1


def tune_space(config: str) -> dict[str, Any]:
    """muster's searched hyperparameters as Tune's domains."""
    from ray import tune

    domains: dict[str, Any] = {}
    for name, param in load_config(config).space().searched().items():
        if isinstance(param, Log):
            domains[name] = tune.loguniform(param.low, param.high)
        elif isinstance(param, Double):
            domains[name] = tune.uniform(param.minval, param.maxval)
        elif isinstance(param, Int):
            domains[name] = tune.randint(param.minval, param.maxval + 1)
        elif isinstance(param, Categorical):
            domains[name] = tune.choice(list(param.vals))
    return domains


def _search(spec: FitSpec) -> tuple[Any, Any]:
    """The arm's search algorithm and scheduler."""
    from ray.tune.schedulers import ASHAScheduler, HyperBandForBOHB
    from ray.tune.search import BasicVariantGenerator
    from ray.tune.search.bohb import TuneBOHB

    class NumberedBOHB(TuneBOHB):
        """TuneBOHB that numbers its trials in the order it draws them (the seed's)."""

        drawn = 0

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            config: dict[str, Any] | None = super().suggest(trial_id)
            if isinstance(config, dict):
                config["number"], self.drawn = self.drawn, self.drawn + 1
            return config

    if spec.arm == "bohb":
        return NumberedBOHB(seed=spec.seed), HyperBandForBOHB(
            time_attr="epoch", max_t=spec.max_length, reduction_factor=spec.reduction_factor)
    points = BasicVariantGenerator(points_to_evaluate=[dict(p) for p in spec.points])
    if spec.arm == "random":
        return points, None  # Tune's default scheduler: FIFO
    return points, ASHAScheduler(time_attr="epoch", max_t=spec.max_length,
                                 grace_period=spec.grace_period,
                                 reduction_factor=spec.reduction_factor,
                                 brackets=spec.brackets)


def fit(spec: FitSpec) -> dict[str, Any]:
    """Run one Tune search on a fresh local Ray of 2 CPUs: its results, each epoch's."""
    import numpy as np

    import ray
    from ray import tune

    sys.path.insert(0, str(DIGITS))
    from train import load_images, split

    # The split keeps train.py's flag seed (0): every trial validates on the same files.
    data = split(*load_images(Path(spec.data), skip_corrupt=False), 0)
    np.random.seed(spec.seed)  # ASHAScheduler draws a trial's bracket from NumPy's generator
    rows: list[dict[str, Any]] = []

    class Collect(tune.Callback):
        def on_trial_result(self, iteration: int, trials: list[Any], trial: Any,
                            result: dict[str, Any], **info: Any) -> None:
            rows.append({key: result[key] for key in ("number", "epoch", "reported_at",
                                                      METRIC)})

    with tempfile.TemporaryDirectory(prefix="muster-bench-tune-search-") as storage:
        started = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=f"{storage}/ray",
                 runtime_env={"env_vars": {"PYTHONPATH": f"{DIGITS}{os.pathsep}{HERE}",
                                           "OMP_NUM_THREADS": "1"}})
        init_s = time.perf_counter() - started
        search_alg, scheduler = _search(spec)
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(train_trial, data=data,
                                                     max_length=spec.max_length,
                                                     seed=spec.seed), {"cpu": 1}),
            param_space={**tune_space(spec.config), "number": -1},  # -1: the searcher's
            tune_config=tune.TuneConfig(metric=METRIC, mode="max", num_samples=spec.trials,
                                        search_alg=search_alg, scheduler=scheduler),
            run_config=tune.RunConfig(storage_path=f"{storage}/results", verbose=0,
                                      callbacks=[Collect()],
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=1)))
        started = time.perf_counter()
        grid = tuner.fit()
        fit_s = time.perf_counter() - started
        results = [grid[i] for i in range(len(grid))]
        configs = [result.config or {} for result in results]
        errors = [f"trial {config.get('number')}: {result.error}"
                  for result, config in zip(results, configs, strict=True) if result.error]
        hparams = {int(config["number"]): {k: _plain(v) for k, v in config.items()
                                           if k != "number"} for config in configs}
        ray.shutdown()
    return {"wall_s": fit_s, "init_s": init_s, "trials": len(results), "errors": errors,
            "hparams": hparams, "rows": rows}


def _plain(value: Any) -> Any:
    """A NumPy scalar (ConfigSpace draws them) as Python's, for JSON."""
    return value.item() if hasattr(value, "item") else value


# -- the runs ------------------------------------------------------------------------------------


@dataclass
class MusterSide:
    configs: dict[str, str]
    runs: dict[int, dict[str, SearchRun]]  # by seed, by arm label
    notes: list[str]


def muster_from_files(paths: Sequence[Path]) -> MusterSide:
    """muster's arms from search.py's results files, a seed or more each (a file may hold
    more arms than another, but every file the same budget)."""
    side = MusterSide({}, {}, [])
    for path in paths:
        _, outcome = merged([path])
        # merged() ends its notes with the file's: its seeds, commit, load average and time.
        more = _side(outcome.data, [f"muster: {outcome.notes[-1]}"])
        expect(not side.configs or budget(more.configs) == budget(side.configs),
               f"{path} has another budget than {paths[0]}")
        expect(not set(more.runs) & set(side.runs), f"{path} repeats a seed of another file")
        side = MusterSide(side.configs or more.configs, side.runs | more.runs,
                          side.notes + more.notes)
    return side


def tune_from_files(paths: Sequence[Path]
                    ) -> tuple[dict[int, dict[str, Run]], dict[str, list[float]], list[str]]:
    """Tune's runs, `ray.init`'s seconds and each file's note of its load, from this
    script's earlier results files (benchmarks/out/tune_search/), a seed or more each."""
    runs: dict[int, dict[str, Run]] = {}
    init_s: dict[str, list[float]] = {}
    notes = []
    for path in paths:
        document = json.loads(path.read_text())
        result = document["benchmarks"]["tune_search"]
        for seed, arms in result["data"]["tune"].items():
            expect(int(seed) not in runs, f"seed {seed} is in two of the files")
            runs[int(seed)] = {arm: run_from_json(run) for arm, run in arms.items()}
        for arm, values in result["data"]["init_s"].items():
            init_s.setdefault(arm, []).extend(values)
        notes += [f"{path.name} (commit {document['machine']['git_commit']}): {note}"
                  for note in result["notes"] if note.startswith(TUNE_LOAD)]
    return runs, init_s, notes


def run_from_json(data: Mapping[str, Any]) -> Run:
    """A Run from its JSON (whose mappings have string keys)."""
    return Run([Report(**r) for r in data["reports"]],
               {int(k): v for k, v in data["stop_steps"].items()},
               {int(k): v for k, v in data["starts"].items()}, data["wall_s"])


def muster_run_here(size: Size) -> MusterSide:
    outcome = study(size, MUSTER_ARMS_RUN)
    return _side(outcome.data, ["muster's arms run here, before Tune's, on the same machine."])


def _side(data: Mapping[str, Any], notes: list[str]) -> MusterSide:
    runs = {int(seed): {label: SearchRun.from_json(run) for label, run in arms.items()}
            for seed, arms in data["runs"].items()}
    return MusterSide(dict(data["configs"]), runs, notes)


def run_tune(muster: MusterSide, seeds: Sequence[int], arms: Sequence[str]
             ) -> tuple[dict[int, dict[str, Run]], dict[str, list[float]]]:
    """Every Tune arm once per seed, rotating which goes first; the runs, and `ray.init`'s
    seconds per arm."""
    runs: dict[int, dict[str, Run]] = {}
    init_s: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="muster-bench-tune-search-") as tmp, \
            loopback_namespace(NAMESPACE):
        work = Path(tmp)
        subprocess.run([sys.executable, str(DIGITS / "prepare_data.py"), "--out",
                        str(work / "data")], check=True, capture_output=True)
        for i, seed in enumerate(seeds):
            shift = i % len(arms)
            runs[seed] = {}
            for arm in [*arms[shift:], *arms[:shift]]:
                spec = plan(arm, seed, muster.configs, muster.runs[seed]["random"],
                            work / "data")
                answer = _fit_in_namespace(spec, work)
                init_s[arm].append(answer["init_s"])
                runs[seed][arm] = tune_run(answer["rows"], spec.max_length, answer["wall_s"])
    return runs, init_s


def _fit_in_namespace(spec: FitSpec, work: Path) -> dict[str, Any]:
    print(f"  tune {spec.arm} seed {spec.seed}", file=sys.stderr, flush=True)
    asked = work / f"{spec.arm}-{spec.seed}.json"
    answered = asked.with_suffix(".out.json")
    asked.write_text(json.dumps(asdict(spec)))
    done = subprocess.run(
        ["ip", "netns", "exec", NAMESPACE, sys.executable, str(Path(__file__).resolve()),
         "--fit", str(asked), "--out", str(answered)],
        capture_output=True, text=True, check=False,
        timeout=max(TIMEOUT_S, TIMEOUT_PER_TRIAL_S * spec.trials))
    expect(done.returncode == 0, f"Tune's {spec.arm} search of seed {spec.seed} exited "
                                 f"{done.returncode}: {done.stderr[-1500:]}")
    answer: dict[str, Any] = json.loads(answered.read_text())
    expect(not answer["errors"], f"Tune's {spec.arm} search of seed {spec.seed}: trials "
                                 f"failed: {'; '.join(answer['errors'])[:1500]}")
    expect(answer["trials"] == spec.trials,
           f"Tune's {spec.arm} search ran {answer['trials']} trials of {spec.trials}")
    if spec.points:
        expect({int(k): v for k, v in answer["hparams"].items()} ==
               {p["number"]: {k: v for k, v in p.items() if k != "number"}
                for p in spec.points},
               f"Tune's {spec.arm} search of seed {spec.seed} ran other trials than "
               "muster random search's")
    print(f"    {answer['trials']} trials, {answer['wall_s']:.0f} s", file=sys.stderr,
          flush=True)
    return answer


# -- the report ----------------------------------------------------------------------------------


def outcome(muster: MusterSide, tune: dict[int, dict[str, Run]],
            init_s: Mapping[str, list[float]]) -> Outcome:
    seeds = sorted(tune)
    runs: dict[str, dict[int, Run]] = {}
    for arm in MUSTER_ARMS:
        if all(arm in muster.runs[seed] for seed in seeds):
            runs[f"muster {arm}"] = {seed: muster_run(muster.runs[seed][arm]) for seed in seeds}
    for arm in next(iter(tune.values())):
        runs[f"tune {arm}"] = {seed: tune[seed][arm] for seed in seeds}
    named = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    tables = [_versus(runs, "muster random", f"(s2) muster and Ray Tune against muster "
                                             f"random search, medians over {named}")]
    if "tune random" in runs:
        tune_only = {label: by_seed for label, by_seed in runs.items()
                     if label.startswith("tune ")}
        tables.append(_versus(tune_only, "tune random", "(s2) Ray Tune against its own "
                                                        f"random arm, medians over {named}"))
    tables.append(_per_seed(runs))
    notes = _notes(muster.configs, runs, init_s) + muster.notes
    data = {"seeds": seeds, "configs": muster.configs, "init_s": dict(init_s),
            "tune": {str(seed): {arm: asdict(run) for arm, run in arms.items()}
                     for seed, arms in tune.items()}}
    return Outcome("tune_search", tables, [], notes, data)


def _versus(runs: Mapping[str, Mapping[int, Run]], reference: str, title: str) -> Table:
    """Per arm, medians over the seeds, against `reference`'s best less WITHIN."""
    rows = []
    for label, by_seed in runs.items():
        results = [compare(seed, runs[reference][seed].reports, run.reports, run.stop_steps,
                           run.starts) for seed, run in by_seed.items()]
        reached = [r.asha.reached.epochs for r in results if r.asha.reached is not None]
        best = [best_accuracy(run.reports) for run in by_seed.values()]
        rows.append([label, f"{median(reached):g}" if reached else "-",
                     f"{median([r.until_ratio(r.asha) for r in results]):.2f}",
                     f"{len(reached)} of {len(results)}",
                     f"{median([r.asha.spent for r in results]):g}",
                     f"{median([r.spent_ratio(r.asha) for r in results]):.2f}",
                     f"{median(best):.4f}", f"{median([r.wall_s for r in by_seed.values()]):.0f}"])
    return Table(title, ["arm", f"epochs until within {WITHIN * 100:.1f} pp of "
                                f"{reference}'s best {METRIC}", "/ random",
                         "seeds that got there", "epochs in all", "/ random",
                         f"best {METRIC}", "wall s"], rows)


def _per_seed(runs: Mapping[str, Mapping[int, Run]]) -> Table:
    rows = []
    seeds = sorted({seed for by_seed in runs.values() for seed in by_seed})
    for seed in seeds:
        for label, by_seed in runs.items():
            run = by_seed[seed]
            targets = [compare(seed, runs[reference][seed].reports, run.reports,
                               run.stop_steps, run.starts).asha.reached
                       for reference in ("muster random", "tune random") if reference in runs]
            rows.append([str(seed), label, *(_reached(t) for t in targets),
                         str(steps_spent(run.reports, run.starts)),
                         f"{best_accuracy(run.reports):.4f}", str(len(run.stop_steps)),
                         f"{run.wall_s:.0f}"])
    references = [f"reached {r}'s target (epochs, #trial, epoch)"
                  for r in ("muster random", "tune random") if r in runs]
    return Table("(s2) the runs", ["seed", "arm", *references, "epochs in all",
                                   f"best {METRIC}", "stopped early", "wall s"], rows)


def _reached(reached: Reached | None) -> str:
    if reached is None:
        return "not reached"
    return f"{reached.epochs} (#{reached.report.trial}, {reached.report.step})"


def _notes(configs: Mapping[str, str], runs: Mapping[str, Mapping[int, Run]],
           init_s: Mapping[str, list[float]]) -> list[str]:
    spec, ahead = budget(configs), load_config(configs["random"]).searcher.max_concurrent_trials
    brackets = hyperband_brackets(spec.max_length, spec.reduction_factor)
    rungs = []
    step = spec.grace_period
    while step < spec.max_length:
        rungs.append(step)
        step *= spec.reduction_factor
    notes = [f"{spec.trials} trials of up to {spec.max_length} epochs per arm and seed; Tune: "
             "2 at once on `ray.init(num_cpus=2)`, one CPU a trial; muster: 2 at once on a "
             f"2-slot server, its searchers drawing up to {ahead} trials ahead "
             "(max_concurrent_trials, muster's default).",
             f"Tune's ASHA: `ASHAScheduler(time_attr='epoch', max_t={spec.max_length}, "
             f"grace_period={spec.grace_period}, reduction_factor={spec.reduction_factor})`, "
             f"rungs at epochs {', '.join(map(str, rungs))}; `asha` 1 bracket, "
             "`adaptive_asha` as many as muster's adaptive ASHA, each trial's drawn at random "
             "(NumPy seeded with the seed).",
             f"Tune's BOHB: `TuneBOHB(seed=seed)` with `HyperBandForBOHB(time_attr='epoch', "
             f"max_t={spec.max_length}, reduction_factor={spec.reduction_factor})`, "
             "brackets filled in this order (then again): "
             f"{'; '.join(f'{n} trials from epoch {r}' for n, r in brackets)} (HyperBand "
             "has no grace period); a trial waits, paused, at each rung until its bracket "
             "is judged there.",
             "Tune's random and ASHA arms run muster random search's trials of the seed (the "
             "same hyperparameters and seed by trial number); its BOHB and muster's TPE-based "
             "ones draw their own.",
             f"Identical curves: {_identical(runs)} of the validation reports that a Tune arm "
             "made for a trial and epoch that muster random search also reported have its "
             f"{METRIC}."]
    if init_s:
        every = [s for values in init_s.values() for s in values]
        notes.append(f"`ray.init` before each Tune search (not in its wall time): median "
                     f"{median(every):.1f} s.")
    return notes


def _identical(runs: Mapping[str, Mapping[int, Run]]) -> str:
    same = total = 0
    for label, by_seed in runs.items():
        if not label.startswith("tune ") or "muster random" not in runs:
            continue
        for seed, run in by_seed.items():
            if label != "tune bohb":
                agreed, shared = agreeing(runs["muster random"][seed].reports, run.reports)
                same, total = same + agreed, total + shared
    return f"{same:,} of {total:,}"


# -- from the command line -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--muster-results", nargs="+", type=Path, metavar="JSON",
                        help="muster's arms from these results files of search.py --study "
                             "(benchmarks/out/search/)")
    source.add_argument("--run-muster", action="store_true",
                        help="run muster's arms here first (search.py's study with asha and "
                             "bohb; --trials, --max-length and --seeds set its size)")
    source.add_argument("--fit", type=Path, help=argparse.SUPPRESS)  # one search, inside
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="seeds to run (default: every seed of the muster results)")
    parser.add_argument("--trials", type=int, default=32, help="with --run-muster")
    parser.add_argument("--max-length", type=int, default=32, help="with --run-muster")
    parser.add_argument("--arm", action="append", choices=TUNE_ARMS, dest="arms",
                        help="a Tune arm to run (repeatable; default: all)")
    parser.add_argument("--from", dest="sources", nargs="+", type=Path, metavar="JSON",
                        help="show the seeds of these results files of this script "
                             "(benchmarks/out/tune_search/) together, beside muster's "
                             "(--muster-results), instead of running")
    args = parser.parse_args(argv)
    if args.fit:
        spec = FitSpec(**json.loads(args.fit.read_text()))
        args.out.write_text(json.dumps(fit(spec)))
        return 0
    if not (args.muster_results or args.run_muster):
        parser.error("name muster's results (--muster-results) or run them (--run-muster)")
    command = shlex.join([Path(sys.executable).name, "benchmarks/tune_search.py",
                          *(sys.argv[1:] if argv is None else argv)])
    if args.sources:
        if not args.muster_results:
            parser.error("--from shows saved runs beside muster's --muster-results")
        tune, init_s, notes = tune_from_files(args.sources)
        result = outcome(muster_from_files(args.muster_results), tune, init_s)
        result.notes += notes
        print(render_markdown(describe_machine(), [result], command), end="")
        return 0
    missing = tune_missing() or _bohb_missing()
    if missing is not None:
        raise SystemExit(f"tune_search.py cannot run here: {missing}")
    machine = describe_machine()
    load_before, started = os.getloadavg()[0], time.monotonic()
    muster = (muster_from_files(args.muster_results) if args.muster_results else
              muster_run_here(Size(tuple(args.seeds or (1,)), args.trials, args.max_length,
                                   defaults=True)))
    seeds = args.seeds or sorted(muster.runs)
    expect(all(seed in muster.runs for seed in seeds),
           f"muster's results have seeds {sorted(muster.runs)}, not all of {seeds}")
    tune, init_s = run_tune(muster, seeds, args.arms or TUNE_ARMS)
    result = outcome(muster, tune, init_s)
    result.notes.append(f"{TUNE_LOAD} 1-minute load average {load_before:.1f} at the start, "
                        f"{os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs); "
                        f"{time.monotonic() - started:.0f} s in all.")
    print(render_markdown(machine, [result], command), end="")
    print(f"results: {write_json(OUT_DIR, machine, [result], command)}", file=sys.stderr)
    return 0


def _bohb_missing() -> str | None:
    try:
        import ConfigSpace  # noqa: F401
        import hpbandster  # noqa: F401
    except ImportError as exc:
        return f"no TuneBOHB here ({exc}): pip install hpbandster ConfigSpace"
    return None


if __name__ == "__main__":
    sys.exit(main())
