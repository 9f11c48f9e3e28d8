"""The measure of benchmarks/search.py (random search vs adaptive ASHA): epochs spent, and
epochs until a trial first comes within 0.5 pp of random search's best, on hand-made
reports. The benchmark itself runs real searches (`benchmarks/run.py --only search`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load() -> ModuleType:
    """benchmarks/search.py under its own name: its siblings (measure, report, ...) are
    imported as top-level modules, as run.py does, from the end of sys.path."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("bench_search", BENCHMARKS / "search.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load()


def reports(*rows: tuple[int, int, float, float]) -> list[object]:
    """(trial number, step, time, accuracy) rows as the benchmark's Reports."""
    return [bench.Report(trial, step, at, accuracy) for trial, step, at, accuracy in rows]


# Two trials at once: trial 0 learns slowly, trial 1 quickly; trial 2 starts after trial 1.
RANDOM = reports(
    (0, 1, 1.0, 0.50), (1, 1, 1.1, 0.80), (0, 2, 2.0, 0.60), (1, 2, 2.1, 0.95),
    (0, 3, 3.0, 0.70), (1, 3, 3.1, 0.97), (2, 1, 4.0, 0.90), (2, 2, 5.0, 0.96),
    (2, 3, 6.0, 0.98),
)
# The same trials, with ASHA stopping trial 0 after step 1 (it trained one step more before
# the stop reached it) and trial 2 starting in its place.
ASHA = reports(
    (0, 1, 1.0, 0.50), (1, 1, 1.1, 0.80), (0, 2, 2.0, 0.60), (1, 2, 2.1, 0.95),
    (2, 1, 2.5, 0.90), (1, 3, 3.1, 0.97), (2, 2, 3.5, 0.96), (2, 3, 4.5, 0.98),
)


def test_steps_spent_sums_each_trials_highest_step() -> None:
    assert bench.steps_spent(RANDOM) == 9
    assert bench.steps_spent(ASHA) == 8
    assert bench.steps_spent(reports((0, 3, 1.0, 0.5), (0, 1, 0.5, 0.4))) == 3


def test_a_pbt_members_epochs_are_its_own() -> None:
    """A member that started from its parent's epoch 3 trained epochs 4 and 5: 2, not 5."""
    rows = reports((0, 3, 1.0, 0.5), (1, 4, 2.0, 0.6), (1, 5, 3.0, 0.9))
    assert bench.steps_spent(rows) == 8 and bench.steps_spent(rows, {1: 3}) == 5
    assert bench.first_reaching(rows, 0.9, {1: 3}) == bench.Reached(rows[2], 5)
    result = bench.compare(1, RANDOM, rows, {}, {1: 3})
    assert result.asha.spent == 5


def epochs_until(rows: list[object], target: float) -> int | None:
    reached = bench.first_reaching(rows, target)
    return None if reached is None else reached.epochs


@pytest.mark.parametrize(("rows", "target", "expected"), [
    (RANDOM, 0.975, 9),  # trial 2's last step, when every trial has trained 3
    (ASHA, 0.975, 8),
    (RANDOM, 0.95, 4),  # trial 1's step 2: 2 steps each so far
    (RANDOM, 0.5, 1),
    (RANDOM, 0.99, None),
    (list(reversed(RANDOM)), 0.95, 4),  # the order is the reports' times, not the list's
])
def test_first_reaching_counts_every_trials_progress_at_that_moment(
    rows: list[object], target: float, expected: int | None
) -> None:
    assert epochs_until(rows, target) == expected


def test_first_reaching_names_the_report() -> None:
    reached = bench.first_reaching(RANDOM, 0.95)
    assert reached == bench.Reached(bench.Report(1, 2, 2.1, 0.95), 4)


def test_stopped_at_decision_drops_the_epochs_after_each_stop() -> None:
    cut = bench.stopped_at_decision(ASHA, {0: 1})  # ASHA decided at trial 0's step 1
    assert [(r.trial, r.step) for r in cut] == [(0, 1), (1, 1), (1, 2), (2, 1), (1, 3),
                                                 (2, 2), (2, 3)]
    assert bench.steps_spent(cut) == 7


def test_compare_measures_both_arms_against_random_search_best() -> None:
    result = bench.compare(7, RANDOM, ASHA, {0: 1})
    assert result.target == pytest.approx(0.975)
    assert (result.random.reached.epochs, result.random.spent) == (9, 9)
    assert (result.asha.reached.epochs, result.asha.spent) == (8, 8)
    assert (result.asha_at_decision.reached.epochs, result.asha_at_decision.spent) == (7, 7)
    assert result.until_ratio(result.asha) == pytest.approx(8 / 9)
    assert result.until_ratio(result.asha_at_decision) == pytest.approx(7 / 9)
    assert result.spent_ratio(result.asha) == pytest.approx(8 / 9)


def test_an_asha_run_that_never_gets_close_has_an_infinite_ratio() -> None:
    short = [r for r in ASHA if r.trial != 2]
    result = bench.compare(1, RANDOM, short, {})
    assert result.asha.reached is None
    assert result.until_ratio(result.asha) == float("inf")


def test_overshoot_is_the_epochs_past_each_stop_decision() -> None:
    run = bench.SearchRun(searcher="adaptive_asha", seed=1, wall_s=1.0, reports=ASHA,
                          hparams={}, early_stopped=1, stop_steps={0: 1}, verified=2)
    assert run.overshoot() == [1]


def test_the_config_of_each_arm() -> None:
    base = {"name": "digits-search", "searcher": {
        "name": "adaptive_asha", "metric": "val_accuracy", "smaller_is_better": False,
        "max_trials": 24, "max_concurrent_trials": 2, "max_length": 64, "divisor": 4,
        "max_rungs": 4, "mode": "standard"}, "reproducibility": {"experiment_seed": 1234}}
    random = yaml.safe_load(bench._config(base, "random", 3, bench.QUICK))
    assert random["searcher"] == {"name": "random", "metric": "val_accuracy",
                                  "smaller_is_better": False, "max_trials": 6,
                                  "max_concurrent_trials": 2, "max_length": 16}
    assert random["reproducibility"] == {"experiment_seed": 3}
    asha = yaml.safe_load(bench._config(base, "adaptive_asha", 3, bench.FULL))
    assert asha["searcher"] == base["searcher"]
    assert asha["name"] == "bench-search-adaptive_asha-seed-3"
    pbt = yaml.safe_load(bench._config(base, "pbt", 3, bench.STUDY))
    assert pbt["searcher"] == {"name": "pbt", "metric": "val_accuracy",
                               "smaller_is_better": False, "population_size": 16,
                               "num_rounds": 4, "length_per_round": 16,
                               "explore_function": {"hyperparameters": ["lr", "dropout",
                                                                        "batch_size"]}}
    tpe = yaml.safe_load(bench._config(base, "tpe", 3, bench.STUDY_QUICK))["searcher"]
    assert (tpe["name"], tpe["max_trials"], tpe["max_length"]) == ("tpe", 8, 16)
    assert "divisor" not in tpe
    small = yaml.safe_load(bench._config(base, "pbt", 3, bench.STUDY_QUICK))["searcher"]
    assert (small["population_size"], small["num_rounds"], small["length_per_round"]) == (
        4, 2, 8)


def test_reports_agree_where_trial_step_and_accuracy_match() -> None:
    random = reports((0, 1, 1.0, 0.5), (0, 2, 2.0, 0.6), (1, 1, 1.0, 0.7))
    other = reports((0, 1, 9.0, 0.5), (0, 2, 9.0, 0.61), (2, 1, 9.0, 0.7))
    assert bench.agreeing(random, other) == (1, 2)  # trial 2 has no counterpart
    assert bench.agreeing(random, random) == (3, 3)
