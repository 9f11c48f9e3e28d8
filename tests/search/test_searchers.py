"""The searchers over Optuna, on histories built by hand: bounds and types, the same seed
drawing the same values, a grid enumerating its product once, ASHA's verdicts."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from muster.config import ExperimentConfig, load_config
from muster.search.adaptive_asha import AdaptiveAsha
from muster.search.base import Searcher
from muster.search.history import PastTrial
from muster.search.searchers import searcher_for
from muster.states import SearchOutcome

SPACE = """\
hyperparameters:
  lr: {type: log, minval: -4, maxval: -1}
  width: {type: categorical, vals: [64, 128, 256]}
  dropout: {type: double, minval: 0.0, maxval: 0.5}
  layers: {type: int, minval: 1, maxval: 4}
  batch: 32
"""


def config(searcher: str, space: str = SPACE) -> ExperimentConfig:
    return load_config(f"name: s\nentrypoint: t\nsearcher: {searcher}\n{space}")


def draw(searcher: Searcher, count: int,
         outcome: Any = None) -> list[dict[str, Any]]:
    """`count` draws one after another; each drawn trial then ends as `outcome(params)`
    says (COMPLETE with a value) or stays RUNNING."""
    history: list[PastTrial] = []
    for number in range(count):
        params, attrs = searcher.ask(history, number)
        if outcome is None:
            history.append(PastTrial(number, SearchOutcome.RUNNING, params, attrs=attrs))
        else:
            history.append(PastTrial(number, SearchOutcome.COMPLETE, params, outcome(params),
                                     {1: outcome(params)}, attrs))
    return [dict(p.params) for p in history]


def in_bounds(params: dict[str, Any]) -> bool:
    return (1e-4 <= params["lr"] <= 1e-1 and params["width"] in (64, 128, 256)
            and 0 <= params["dropout"] <= 0.5 and isinstance(params["layers"], int)
            and 1 <= params["layers"] <= 4 and "batch" not in params)


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_draws_respect_bounds_and_types_and_the_seed(name: str) -> None:
    conf = config(f"{{name: {name}, metric: loss, max_trials: 30}}")

    def loss(params: dict[str, Any]) -> float:
        return (math.log10(params["lr"]) + 2.5) ** 2 + params["dropout"]

    first = draw(searcher_for(conf, seed=5), 30, loss)
    assert all(in_bounds(p) for p in first)
    assert draw(searcher_for(conf, seed=5), 30, loss) == first
    assert draw(searcher_for(conf, seed=6), 30, loss) != first
    assert len({p["lr"] for p in first}) == 30


def test_a_random_draw_depends_on_the_seed_and_number_alone() -> None:
    searcher = searcher_for(config("{name: random, metric: loss, max_trials: 9}"), seed=3)
    alone = draw(searcher, 4)
    after_results = draw(searcher, 4, outcome=lambda p: p["dropout"])
    assert alone == after_results


@pytest.mark.parametrize("learner", ["tpe", "bohb"])
def test_tpe_learns_from_results(learner: str) -> None:
    """After its random start, TPE (alone, or drawing for BOHB's brackets) draws near the
    best values more often than random does."""
    conf = "{{name: {}, metric: loss, max_trials: 40, max_length: 16}}"
    space = "hyperparameters: {x: {type: double, minval: 0, maxval: 1}}\n"

    def loss(params: dict[str, Any]) -> float:
        return float((params["x"] - 0.8) ** 2)

    def near(name: str) -> int:
        draws = draw(searcher_for(config(conf.format(name), space), seed=1), 40, loss)
        return sum(abs(p["x"] - 0.8) < 0.1 for p in draws[20:])

    assert near(learner) > near("random")


def test_a_grid_enumerates_its_product_once_whatever_ends_when() -> None:
    conf = config("{name: grid, metric: loss}", "hyperparameters:\n"
                  "  a: {type: int, minval: 1, maxval: 3}\n"
                  "  b: {type: categorical, vals: [x, y]}\n"
                  "  c: {type: double, minval: 0, maxval: 1, count: 2}\n")
    assert conf.trial_count() == 12
    searcher = searcher_for(conf, seed=9)
    running = draw(searcher, 12)
    finished = draw(searcher, 12, outcome=lambda p: float(p["a"]))
    expected = sorted(itertools.product([1, 2, 3], ["x", "y"], [0.0, 1.0]))
    for draws in (running, finished):
        assert sorted((p["a"], p["b"], p["c"]) for p in draws) == expected
    assert draw(searcher_for(conf, seed=9), 12) == running


def test_ask_refuses_a_history_with_a_gap() -> None:
    searcher = searcher_for(config("{name: random, metric: loss, max_trials: 3}"), seed=1)
    with pytest.raises(ValueError, match=r"trials 0..1 in order before trial 2"):
        searcher.ask([PastTrial(0, SearchOutcome.RUNNING, {})], 2)


def asha_history(values: list[float], judged: float, step: int) -> list[PastTrial]:
    """Earlier trials that completed rung 0 (step 1) with `values`; then the judged one."""
    history = [PastTrial(n, SearchOutcome.COMPLETE, {"x": 0.5}, v, {1: v},
                         {"completed_rung_0": v}) for n, v in enumerate(values)]
    history.append(PastTrial(len(values), SearchOutcome.RUNNING, {"x": 0.5},
                             intermediate={step: judged}))
    return history


ASHA = ("{name: asha, metric: loss, max_trials: 20, max_length: 16, divisor: 4, "
        "max_rungs: 3}")
X = "hyperparameters: {x: {type: double, minval: 0, maxval: 1}}\n"


def test_asha_keeps_the_best_quarter_at_a_rung_and_stops_the_rest() -> None:
    searcher = searcher_for(config(ASHA, X), seed=1)
    assert searcher.prunes and searcher.pruner()._min_resource == 1  # rungs 1, 4, 16
    earlier = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]  # with the judged one: 8, the best 2 go on
    worse = searcher.judge(asha_history(earlier, 0.65, step=1), 7)
    assert worse.prune and worse.rung == 1 and worse.attrs == {"completed_rung_0": 0.65}
    better = searcher.judge(asha_history(earlier, 0.55, step=1), 7)
    assert not better.prune and better.rung == 1
    # A report past a rung it has not completed is judged at that rung...
    assert searcher.judge(asha_history(earlier, 9.0, step=3), 7).prune
    # ...but one that passed rung 0 is not judged again before rung 1 (step 4).
    history = asha_history(earlier, 9.0, step=3)
    history[-1] = PastTrial(7, SearchOutcome.RUNNING, {"x": 0.5}, intermediate={1: 0.55, 3: 9.0},
                            attrs={"completed_rung_0": 0.55})
    assert not searcher.judge(history, 7).prune


def test_asha_stops_a_trial_that_reports_nan() -> None:
    searcher = searcher_for(config(ASHA, X), seed=1)
    assert searcher.judge(asha_history([0.5], math.nan, step=1), 1).prune


def test_smaller_is_better_false_keeps_the_highest() -> None:
    conf = config(ASHA.replace("loss,", "accuracy, smaller_is_better: false,"), X)
    searcher = searcher_for(conf, seed=1)
    earlier = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    assert not searcher.judge(asha_history(earlier, 1.05, step=1), 7).prune
    assert searcher.judge(asha_history(earlier, 0.75, step=1), 7).prune


@pytest.mark.parametrize(("mode", "rungs", "divisor", "brackets"), [
    ("aggressive", 5, 4, 1), ("standard", 5, 4, 3), ("conservative", 5, 4, 5),
    ("standard", 4, 3, 2), ("conservative", 3, 2, 3), ("aggressive", 1, 2, 1),
])
def test_adaptive_asha_makes_the_brackets_its_mode_asks_for(
        mode: str, rungs: int, divisor: int, brackets: int) -> None:
    conf = config(f"{{name: adaptive_asha, metric: loss, max_trials: 20, max_length: 100, "
                  f"mode: {mode}, max_rungs: {rungs}, divisor: {divisor}}}", X)
    searcher = searcher_for(conf, seed=1)
    assert isinstance(searcher, AdaptiveAsha) and searcher.brackets() == brackets
    pruner = searcher.pruner()
    # HyperbandPruner makes floor(log(max / min, divisor)) + 1 brackets.
    low = searcher.min_resource()
    high = pruner._max_resource
    assert isinstance(high, int)
    assert math.floor(math.log(high / low, divisor)) + 1 == brackets


@pytest.mark.parametrize("mode", ["aggressive", "standard"])
def test_bohb_is_adaptive_ashas_brackets_with_tpes_draws(mode: str) -> None:
    """The same pruner as adaptive_asha's at the same settings (so the same early stops on
    the same reports), and TPE's sampler in place of random draws."""
    settings = f"metric: loss, max_trials: 20, max_length: 64, divisor: 2, mode: {mode}"
    bohb = searcher_for(config(f"{{name: bohb, {settings}}}", X), seed=1)
    asha = searcher_for(config(f"{{name: adaptive_asha, {settings}}}", X), seed=1)
    assert isinstance(bohb, AdaptiveAsha) and bohb.prunes
    assert type(bohb.sampler(3)).__name__ == "TPESampler"
    assert type(asha.sampler(3)).__name__ == "RandomSampler"
    assert (bohb.pruner()._min_resource, bohb.pruner()._max_resource, bohb.brackets()) == (
        asha.pruner()._min_resource, asha.pruner()._max_resource, asha.brackets())
    earlier = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    for judged in (0.55, 0.95):
        history = asha_history(earlier, judged, step=4)
        assert bohb.judge(history, 7).prune == asha.judge(history, 7).prune


@pytest.mark.parametrize("searcher", [
    "{name: random, metric: loss, max_trials: 2}",
    "{name: tpe, metric: loss, max_trials: 2}",
    "{name: grid, metric: loss}",
    "{name: asha, metric: loss, max_trials: 2, max_length: 8}",
    "{name: adaptive_asha, metric: loss, max_trials: 2, max_length: 8}",
    "{name: bohb, metric: loss, max_trials: 2, max_length: 8}",
])
def test_the_config_knows_which_searchers_prune(searcher: str) -> None:
    """The supervisor asks the config (no Optuna import) whether a pruner may stop a trial;
    it must agree with the searcher itself."""
    space = "hyperparameters:\n  lr: {type: categorical, vals: [0.1, 0.2]}\n"
    chosen = config(searcher, space)
    assert chosen.searcher.prunes() == searcher_for(chosen, seed=1).prunes


# -- several objectives (searcher.metrics) --------------------------------------------------

TWO = "metrics: [{name: a}, {name: b}]"
XY = "hyperparameters: {x: {type: double, minval: 0, maxval: 1}, y: {type: double, " \
     "minval: 0, maxval: 1}}\n"


def draw_multi(searcher: Searcher, count: int) -> list[dict[str, Any]]:
    """`count` draws, each ending COMPLETE with the objectives a = (x - 0.2)² + y and
    b = (x - 0.4)² + y: they disagree on x, and both want y = 0 (the front is y = 0,
    0.2 ≤ x ≤ 0.4)."""
    history: list[PastTrial] = []
    for number in range(count):
        params, attrs = searcher.ask(history, number)
        a = (params["x"] - 0.2) ** 2 + params["y"]
        b = (params["x"] - 0.4) ** 2 + params["y"]
        history.append(PastTrial(number, SearchOutcome.COMPLETE, params, a, {}, attrs, (a, b)))
    return [dict(p.params) for p in history]


@pytest.mark.parametrize("name", ["tpe", "nsga2"])
def test_a_multi_objective_search_learns_where_the_front_is(name: str) -> None:
    """TPE (MOTPE) and NSGA-II, given both objectives of each trial, draw near the front
    (small y) more often than random draws do, and the same seed draws the same trials."""
    def near(searcher: str) -> int:
        conf = config(f"{{name: {searcher}, max_trials: 60, {TWO}}}", XY)
        draws = draw_multi(searcher_for(conf, seed=2), 60)
        return sum(p["y"] < 0.15 for p in draws[30:])

    assert near(name) > near("random")
    conf = config(f"{{name: {name}, max_trials: 12, {TWO}}}", XY)
    assert draw_multi(searcher_for(conf, seed=4), 12) == draw_multi(searcher_for(conf, seed=4), 12)


def test_nsga2_breeds_generations_of_a_quarter_of_max_trials() -> None:
    sizes = {trials: searcher_for(config(f"{{name: nsga2, max_trials: {trials}, {TWO}}}", XY),
                                  seed=1).population_size()  # type: ignore[attr-defined]
             for trials in (8, 40, 1000)}
    assert sizes == {8: 4, 40: 10, 1000: 50}


PBT = ("{name: pbt, metric: loss, population_size: 4, num_rounds: 3, length_per_round: 5, "
       "explore_function: {resample_probability: 0.0, perturb_factor: 0.5}}")


def ended(number: int, params: dict[str, Any], value: float | None,
          checkpoint: int | None = 100, outcome: SearchOutcome = SearchOutcome.COMPLETE,
          ) -> PastTrial:
    return PastTrial(number, outcome, params, value, {5: value} if value is not None else {},
                     checkpoint=None if checkpoint is None else checkpoint + number)


def test_pbt_copies_the_best_in_place_of_the_worst_and_continues_the_rest() -> None:
    from muster.search.history import NothingToDraw

    pbt = searcher_for(config(PBT), seed=4)
    first = draw(pbt, 4)  # generation 0: random draws
    assert all(in_bounds(p) for p in first) and [pbt.draw([], 0).lineage.generation] == [0]
    assert list(pbt.must_end_first(3)) == [] and list(pbt.must_end_first(5)) == [0, 1, 2, 3]
    # loss: trial 2 best, trial 0 worst
    history = [ended(n, p, v) for n, (p, v) in enumerate(zip(first, [0.9, 0.5, 0.1, 0.3],
                                                             strict=True))]
    lineages = [pbt.draw(history, 4 + i).lineage for i in range(4)]
    assert [(x.action, x.parent, x.replaces) for x in lineages] == [
        ("exploit", 2, 0), ("continue", 1, None), ("continue", 2, None), ("continue", 3, None)]
    assert [x.checkpoint for x in lineages] == [102, 101, 102, 103]
    assert {x.generation for x in lineages} == {1}
    copy = pbt.draw(history, 4)
    assert copy.params != first[2] and in_bounds(copy.params)
    assert copy.params["layers"] in (1, 2, 3, 4) and copy.params["width"] in (64, 128, 256)
    assert copy.lineage.changed == {k: [first[2][k], v] for k, v in copy.params.items()
                                    if first[2][k] != v}
    assert pbt.draw(history, 4) == copy  # seeded by the experiment's seed and the number
    assert pbt.draw(history, 5).params == first[1]  # continued: the same values
    # A member that failed, or left no checkpoint, is replaced; the best go on twice.
    history[1] = ended(1, first[1], None, outcome=SearchOutcome.FAILED)
    history[3] = ended(3, first[3], 0.3, checkpoint=None)
    lineages = [pbt.draw(history, 4 + i).lineage for i in range(4)]
    assert [(x.action, x.parent, x.replaces) for x in lineages] == [
        ("continue", 0, None), ("exploit", 2, 1), ("continue", 2, None), ("exploit", 2, 3)]
    # Maximised: the highest value is the best.
    higher = searcher_for(config(PBT.replace("metric: loss", "metric: acc, "
                                             "smaller_is_better: false")), seed=4)
    healthy = [ended(n, p, v) for n, (p, v) in enumerate(zip(first, [0.9, 0.5, 0.1, 0.3],
                                                             strict=True))]
    assert (higher.draw(healthy, 6).lineage.action, higher.draw(healthy, 6).lineage.parent) \
        == ("exploit", 0)
    # Nothing to continue from: the search says why it stops.
    failed = [ended(n, p, None, outcome=SearchOutcome.FAILED) for n, p in enumerate(first)]
    with pytest.raises(NothingToDraw, match=r"no trial of generation 0 \(trials 1 to 4\)"):
        pbt.draw(failed, 4)


def test_pbt_explores_within_each_range() -> None:
    import random

    from muster.search.pbt import Pbt

    pbt = searcher_for(config(PBT.replace("perturb_factor: 0.5", "perturb_factor: 0.9")),
                       seed=1)
    assert isinstance(pbt, Pbt)
    edge = {"lr": 1e-1, "width": 256, "dropout": 0.5, "layers": 4}
    low = {"lr": 1e-4, "width": 64, "dropout": 0.0, "layers": 1}
    rng = random.Random(0)
    seen = [pbt.explore(start, rng) for start in (edge, low) for _ in range(50)]
    assert all(in_bounds(p) for p in seen)
    assert {p["width"] for p in seen} == {64, 128, 256}  # neighbours, from either end
    assert {p["layers"] for p in seen} >= {1, 2, 3, 4} - {3}  # an int moves by one at least
    resampled = searcher_for(config(PBT.replace("resample_probability: 0.0",
                                                "resample_probability: 1.0")), seed=1)
    assert isinstance(resampled, Pbt)
    draws = [resampled.explore(edge, rng) for _ in range(30)]
    assert all(in_bounds(p) for p in draws) and len({p["lr"] for p in draws}) == 30
    # Only those named change (a width shapes the model: it cannot change mid-training).
    some = searcher_for(config(PBT.replace("perturb_factor: 0.5", "perturb_factor: 0.5, "
                                           "hyperparameters: [lr, dropout]")), seed=1)
    assert isinstance(some, Pbt)
    draws = [some.explore(low, rng) for _ in range(30)]
    assert {(p["width"], p["layers"]) for p in draws} == {(64, 1)}
    assert len({p["lr"] for p in draws}) > 1 and all(in_bounds(p) for p in draws)
