"""The search space and the searcher block: what a submission may write, and the key path
of every problem it must not."""

from __future__ import annotations

import math

import pytest

from muster.config import load_config, space
from muster.config.space import Categorical, Const, Double, Int, Log
from muster.errors import ConfigError

BASE = "name: x\nentrypoint: python t.py\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(BASE + text, source="exp.yaml")
    return str(info.value).splitlines()[1:]


def test_every_form_parses_with_its_key_path() -> None:
    parsed = space.parse({
        "lr": {"type": "log", "minval": -4, "maxval": -1},
        "width": {"type": "categorical", "vals": [64, 128]},
        "model": {"dropout": {"type": "double", "minval": 0, "maxval": 0.5, "count": 3},
                  "layers": {"type": "int", "minval": 1, "maxval": 3}},
        "batch": 32, "opt": {"type": "const", "val": {"name": "sgd"}},
    })
    assert parsed.params == {
        "lr": Log(-4.0, -1.0, 10.0), "width": Categorical((64, 128)),
        "model.dropout": Double(0.0, 0.5, 3), "model.layers": Int(1, 3),
        "batch": Const(32), "opt": Const({"name": "sgd"}),
    }
    assert list(parsed.searched()) == ["lr", "width", "model.dropout", "model.layers"]
    chosen = {"lr": 0.01, "width": 64, "model.dropout": 0.25, "model.layers": 2}
    assert parsed.hparams(chosen) == {"lr": 0.01, "width": 64, "batch": 32,
                                      "opt": {"name": "sgd"},
                                      "model": {"dropout": 0.25, "layers": 2}}


def test_grid_points() -> None:
    assert Int(1, 3).grid() == [1, 2, 3]
    assert Int(0, 10, count=3).grid() == [0, 5, 10]
    assert Int(0, 1, count=5).grid() == [0, 1]  # whole numbers, each once
    assert Double(0, 1, count=3).grid() == [0.0, 0.5, 1.0]
    assert Double(0, 1, count=1).grid() == [0.5]
    log = Log(-3, -1, 10, count=3).grid()
    assert [math.log10(float(v)) for v in log] == pytest.approx([-3, -2, -1])
    grid = space.parse({"a": {"type": "int", "minval": 1, "maxval": 4},
                        "b": {"type": "categorical", "vals": ["x", "y", "z"]},
                        "c": {"type": "double", "minval": 0, "maxval": 1, "count": 2}})
    assert grid.grid_size() == 24
    for param in (Int(0, 10, count=3), Int(0, 1, count=5), Int(0, 10, count=12), Int(-3, 7),
                  Int(0, 100, count=99), Double(0, 1, count=4), Log(-3, -1, 10, count=2),
                  Categorical(("a", 1, None))):
        assert param.points() == len(param.grid()), param  # counted, as built


def test_a_huge_grid_is_refused_by_counting_it_never_by_building_it() -> None:
    """10^12 points (issue 12: the supervisor built them all, MemoryError under SQLite's
    write lock): refused at once, naming the parameter with the most points."""
    found = problems("searcher: {name: grid, metric: l}\nhyperparameters:\n"
                     "  lr: {type: double, minval: 0, maxval: 1, count: 1000000}\n"
                     "  wd: {type: log, minval: -5, maxval: -1, count: 1000000}\n"
                     "  n: {type: int, minval: 0, maxval: 999, count: 100000000}\n")
    assert found == ["hyperparameters.lr: the grid has about 10^15 points (lr 1000000 x wd "
                     "1000000 x n 1000), more than the 10,000 trials an experiment may run; "
                     "use fewer points, or a random or tpe search"]
    at_cap = BASE + ("searcher: {name: grid, metric: l}\nhyperparameters:\n"
                     "  a: {type: double, minval: 0, maxval: 1, count: 1000}\n"
                     "  b: {type: categorical, vals: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n")
    assert load_config(at_cap).trial_count() == 10_000
    assert problems(at_cap.removeprefix(BASE).replace("1000}", "1001}")) == [
        "hyperparameters.a: the grid has 10,010 points (a 1001 x b 10), more than the 10,000 "
        "trials an experiment may run; use fewer points, or a random or tpe search"]


@pytest.mark.parametrize(("text", "expected"), [
    ("hyperparameters: {lr: {type: log, minval: -1, maxval: -4}}",
     ["hyperparameters.lr.maxval: must be >= minval (-1), got -4"]),
    ("hyperparameters: {m: {n: {type: int, minval: 1.5, maxval: 3}}}",
     ["hyperparameters.m.n.minval: must be a whole number, got 1.5"]),
    ("hyperparameters: {c: {type: categorical, vals: []}}",
     ["hyperparameters.c.vals: must be a non-empty list of values"]),
    ("hyperparameters: {c: {type: categorical, vals: [1, [2]]}}",
     ["hyperparameters.c.vals[1]: must be a number, a string, true/false or null, got list"]),
    ("hyperparameters: {c: {type: categorical, vals: [a, a]}}",
     ["hyperparameters.c.vals: lists a value twice"]),
    ("hyperparameters: {d: {type: double, minval: 0}}",
     ["hyperparameters.d.maxval: required for type double"]),
    ("hyperparameters: {d: {type: double, minval: 0, maxval: 1, vals: [1]}}",
     ["hyperparameters.d.vals: unknown key for type double; allowed: count, maxval, minval"]),
    ("hyperparameters: {d: {type: uniform}}",
     ["hyperparameters.d.type: must be one of const, int, double, log, categorical, got "
      "'uniform'"]),
    ("hyperparameters: {lr: {type: log, minval: 1, maxval: 400}}",
     ["hyperparameters.lr: 10 ** 1 .. 10 ** 400 is out of the range of a floating-point "
      "number; use smaller exponents"]),
    ("hyperparameters: {lr: {type: log, minval: 1, maxval: 2, base: 1}}",
     ["hyperparameters.lr.base: must be a number > 0 other than 1, got 1"]),
    ("hyperparameters: {m: {}}",
     ["hyperparameters.m: an empty mapping; give it hyperparameters, or write `{type: const, "
      "val: {}}` for an empty constant"]),
])
def test_invalid_spaces_name_the_key_path(text: str, expected: list[str]) -> None:
    assert problems(text) == expected


def test_two_problems_in_a_space_are_both_reported() -> None:
    text = ("hyperparameters: {a: {type: int, minval: 3, maxval: 1}, "
            "b: {type: double, minval: x, maxval: 1}}")
    assert problems(text) == ["hyperparameters.a.maxval: must be >= minval (3), got 1",
                              "hyperparameters.b.minval: must be a finite number, got 'x'"]


SPACE = "hyperparameters: {lr: {type: double, minval: 0, maxval: 1}}\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("searcher: {name: random}\n" + SPACE,
     ["searcher.metric: required by the random searcher, which compares trials by a "
      "validation metric: name one the script reports with report_validation, e.g. "
      "`metric: val_loss`",
      "searcher.max_trials: required by the random searcher: how many trials to run in all"]),
    ("searcher: {name: asha, metric: l, max_trials: 4}\n" + SPACE,
     ["searcher.max_length: required by asha, whose rungs are fractions of it (in the steps "
      "the script reports validation with)"]),
    ("searcher: {name: asha, metric: l, max_trials: 4, time_metric: epochs}\n" + SPACE,
     ["searcher.max_length: required by asha, whose rungs are fractions of it (in the steps "
      "the script reports validation with)",
      "searcher.time_metric: counts max_length in that metric's values: set "
      "searcher.max_length too"]),
    ("searcher: {name: asha, metric: l, max_trials: 4, time_metric: epochs, "
     "max_length: {epochs: 3}}\n" + SPACE,
     ["searcher.max_length_unit: max_length is counted in time_metric 'epochs''s values, "
      "not in epochs; remove one of them"]),
    ("searcher: {name: asha, metric: l, max_trials: 4, max_length: 9, time_metric: 'a b'}\n"
     + SPACE, ["searcher.time_metric: a metric name must be 1 to 128 characters: letters, "
               "digits and _ . / : @ + -, the first a letter, a digit or _; got 'a b'; name "
               "the validation metric as the script reports it"]),
    ("searcher: {name: asha, metric: l, max_trials: 4, max_length: 9, mode: aggressive}\n"
     + SPACE, ["searcher.mode: only the adaptive_asha and bohb searchers use it, not asha; "
               "remove it"]),
    ("searcher: {name: grid, metric: l, max_trials: 3}\n"
     "hyperparameters: {a: {type: int, minval: 1, maxval: 3}}\n",
     ["searcher.max_trials: a grid runs one trial per point (the product of the counts); "
      "remove max_trials"]),
    ("searcher: {name: grid, metric: l}\n" + SPACE,
     ["hyperparameters.lr.count: a grid search needs the number of points of this double "
      "range; add e.g. `count: 4`"]),
    ("searcher: {name: grid, metric: l}\n"
     "hyperparameters: {n: {type: int, minval: 0, maxval: 100000}}\n",
     ["hyperparameters.n.count: this int range holds 100001 values; a grid over all of them "
      "is surely a mistake: add e.g. `count: 4`"]),
    ("searcher: {name: random, metric: l, max_trials: 2}\nhyperparameters: {a: 1}\n",
     ["searcher.name: the random searcher needs at least one hyperparameter to choose (int, "
      "double, log or categorical) under `hyperparameters`; with only constants use `name: "
      "single`"]),
    (SPACE,
     ["hyperparameters.lr: the single searcher runs one trial with fixed values, and this is a "
      "range: make it a constant, or search it, e.g. with `searcher: {name: random, "
      "max_trials: 1, metric: ...}`"]),
    ("searcher: {name: single, max_trials: 2}\n",
     ["searcher.max_trials: the single searcher runs one trial; choose random, tpe, nsga2, "
      "asha, adaptive_asha, bohb or pbt to run more"]),
    ("searcher: {name: bayes}\n",
     ["searcher.name: must be 'single', 'grid', 'random', 'tpe', 'asha', 'adaptive_asha', "
      "'bohb', 'nsga2' or 'pbt', got 'bayes'"]),
    ("searcher: {name: pbt, metric: l}\n" + SPACE,
     ["searcher.population_size: required by the pbt searcher: how many trials train side "
      "by side in each round",
      "searcher.num_rounds: required by the pbt searcher: how many rounds (generations) the "
      "population trains",
      "searcher.length_per_round: required by the pbt searcher: how far each round trains, "
      "in the steps the script reports validation with (or {batches: N}, {epochs: N})"]),
    ("searcher: {name: pbt, metric: l, population_size: 4, num_rounds: 3, "
     "length_per_round: 5, max_trials: 12, max_length: 15}\n" + SPACE,
     ["searcher.max_trials: pbt runs population_size * num_rounds trials (one per member and "
      "round); remove max_trials",
      "searcher.max_length: pbt trains each round length_per_round further (num_rounds * "
      "length_per_round in all); remove max_length"]),
    ("searcher: {name: pbt, metric: l, population_size: 1000, num_rounds: 11, "
     "length_per_round: 5}\n" + SPACE,
     ["searcher.num_rounds: population_size * num_rounds is 11,000 trials, over the 10,000 "
      "a search may run"]),
    ("searcher: {name: pbt, metric: l, population_size: 4, num_rounds: 2, "
     "length_per_round: 5, replace_function: {truncate_fraction: 0.8}, "
     "explore_function: {perturb_factor: 1.5}}\n" + SPACE,
     ["searcher.replace_function.truncate_fraction: must be <= 0.5, got 0.8",
      "searcher.explore_function.perturb_factor: must be < 1.0, got 1.5"]),
    ("searcher: {name: pbt, metric: l, population_size: 4, num_rounds: 2, "
     "length_per_round: 5, explore_function: {hyperparameters: [lr, batch, nope]}}\n" + SPACE,
     ["searcher.explore_function.hyperparameters: names 'batch', which is not a searched "
      "hyperparameter (searched: lr); name the key paths to explore",
      "searcher.explore_function.hyperparameters: names 'nope', which is not a searched "
      "hyperparameter (searched: lr); name the key paths to explore"]),
    ("searcher: {name: random, metric: l, max_trials: 3, population_size: 4}\n" + SPACE,
     ["searcher.population_size: only the pbt searcher uses it, not random; remove it"]),
    ("searcher: {name: pbt, population_size: 4, num_rounds: 2, length_per_round: 5, "
     "metrics: [{name: a}, {name: b}]}\n" + SPACE,
     ["searcher.metrics: the pbt searcher compares trials by one metric (it ranks each "
      "generation by one); search several objectives with grid, random, tpe or nsga2, or "
      "keep one metric"]),
    ("reproducibility: {experiment_seed: -1}\n",
     ["reproducibility.experiment_seed: must be >= 0, got -1"]),
    ("searcher: {name: bohb, max_trials: 4, max_length: 9, metrics: [{name: a}, {name: b}]}\n"
     + SPACE,
     ["searcher.metrics: the bohb searcher compares trials by one metric (a pruner judges "
      "one); search several objectives with grid, random, tpe or nsga2, or keep one metric"]),
    ("searcher: {name: nsga2, max_trials: 4, metrics: [{name: a}, {name: a}]}\n" + SPACE,
     ["searcher.metrics: names an objective twice (a, a); each metric once"]),
    ("searcher: {name: tpe, max_trials: 4, metric: b, metrics: [{name: a}, {name: b}]}\n"
     + SPACE,
     ["searcher.metric: with searcher.metrics the first objective (a) is the metric; remove "
      "metric and smaller_is_better, or make them the first objective's"]),
    ("searcher: {name: nsga2, max_trials: 4, metrics: [{name: a}]}\n" + SPACE,
     ["searcher.metrics: must have at least 2 items"]),
    ("searcher: {name: nsga2, metrics: [{name: a}, {name: b, smaller: no}]}\n" + SPACE,
     ["searcher.metrics[1].smaller: unknown key; the keys allowed here are name, "
      "smaller_is_better"]),
])
def test_invalid_searchers_say_what_to_change(text: str, expected: list[str]) -> None:
    assert problems(text) == expected


def test_trial_counts_and_a_stored_config_reads_back() -> None:
    grid = load_config(BASE + "searcher: {name: grid, metric: l}\nhyperparameters: "
                       "{a: {type: int, minval: 1, maxval: 3}, b: {type: categorical, "
                       "vals: [x, y]}}\n")
    assert grid.trial_count() == 6
    asha = load_config(BASE + "searcher: {name: adaptive_asha, metric: l, max_trials: 20, "
                       "max_length: 16, mode: aggressive}\n" + SPACE)
    assert asha.trial_count() == 20
    pbt = load_config(BASE + "searcher: {name: pbt, metric: l, population_size: 6, "
                      "num_rounds: 4, length_per_round: {epochs: 2}}\n" + SPACE)
    assert pbt.trial_count() == 24
    assert pbt.searcher.max_length_unit == "epochs"
    assert [pbt.searcher.length_of(g) for g in (None, 0, 3)] == [None, 2, 8]
    assert pbt.searcher.replace_function.truncate_fraction == 0.25
    assert type(asha).from_json_dict(asha.to_json_dict()) == asha
    assert load_config(BASE).trial_count() == 1
