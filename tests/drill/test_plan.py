"""A drill's plan: the config scaled to one short trial, the faults' names (pure)."""

from __future__ import annotations

import pytest
import yaml

from muster.config.loading import read_experiment_config
from muster.drill.faults import parse_faults
from muster.drill.plan import DrillOptions, plan_drill
from muster.errors import ConfigError
from muster.states import DrillFault

DIGITS = """
name: digits-mlp
labels: [example]
entrypoint: python train.py --data data --epochs 15 --max_iters=200 --lr 3
harness: true
data: {path: data}
verify: {expected_length: {epochs: 15}}
hyperparameters: {epochs: 15, max_steps: {type: const, val: 40}, width: 64}
"""

SEARCH = """
name: s
entrypoint: [python, train.py]
hyperparameters: {lr: {type: double, minval: 0.001, maxval: 0.1}}
searcher: {name: adaptive_asha, metric: loss, max_trials: 24, max_length: 64, divisor: 3}
"""


def test_the_length_is_scaled_wherever_the_config_says_it() -> None:
    plan = plan_drill(DIGITS, 0.1)
    data = yaml.safe_load(plan.run_config(7, "hang"))
    assert data["entrypoint"] == ["python", "train.py", "--data", "data", "--epochs", "2",
                                  "--max_iters=20", "--lr", "3"]
    assert data["verify"]["expected_length"] == {"epochs": 2}
    assert data["hyperparameters"] == {"epochs": 2, "max_steps": {"type": "const", "val": 4},
                                       "width": 64}
    assert plan.scaled == ["--epochs 15 → 2", "--max_iters 200 → 20",
                           "hyperparameters.epochs 15 → 2",
                           "hyperparameters.max_steps 40 → 4",
                           "verify.expected_length.epochs 15 → 2"]


def test_a_run_config_is_labelled_named_and_valid() -> None:
    text = plan_drill(DIGITS, 0.5).run_config(7, "kill-rank")
    config = read_experiment_config(text).config
    assert config.name == "digits-mlp (drill 7: kill-rank)"
    assert config.labels == ["example", "drill"]


def test_a_search_runs_as_one_random_draw_of_its_space() -> None:
    plan = plan_drill(SEARCH, 0.1)
    config = read_experiment_config(plan.run_config(1, "clean")).config
    assert config.searcher.name == "random"
    assert config.searcher.max_trials == 1
    assert config.searcher.max_length == 7
    assert config.searcher.metric == "loss"
    assert "searcher adaptive_asha → one random draw" in plan.scaled


def test_a_length_never_drops_below_one() -> None:
    plan = plan_drill("name: x\nentrypoint: python t.py --epochs 1\n", 0.01)
    assert yaml.safe_load(plan.run_config(1, "clean"))["entrypoint"][-1] == "1"
    assert plan.scaled == []


def test_an_invalid_config_is_refused_as_a_create_would_be() -> None:
    with pytest.raises(ConfigError, match="entrypoint"):
        plan_drill("name: x\n", 0.1)


def test_faults_are_parsed_in_the_drill_s_order_and_unknown_ones_named() -> None:
    assert parse_faults(["hang,kill-rank", "nan"]) == (DrillFault.KILL_RANK, DrillFault.HANG,
                                                      DrillFault.NAN)
    with pytest.raises(ConfigError, match=r"no fault is called 'pull-cable'.*corrupt-data"):
        parse_faults(["pull-cable"])


@pytest.mark.parametrize(("options", "problem"), [
    ({"scale": 0}, "--scale"), ({"scale": 1.5}, "--scale"), ({"at": 1}, "--at"),
    ({"data": "/etc"}, "--data"), ({"data": "../x"}, "--data"),
])
def test_bad_options_are_refused_with_the_option_named(options: dict[str, object],
                                                       problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        DrillOptions(**options)  # type: ignore[arg-type]


def test_options_round_trip_through_json() -> None:
    options = DrillOptions((DrillFault.HANG,), 0.2, "data", 0.3, 5)
    assert DrillOptions.from_json(options.to_json()) == options
