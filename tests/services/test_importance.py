"""Hyperparameter importance (`muster.services.importance`), on SQLite and PostgreSQL: the
hyperparameter that drives the metric ranks first, the numbers are Optuna's own, which
trials count, the errors, and the cache.

Experiments, trials and validation reports are stored directly (test setup, not
transitions), with real configs; each trial's values are fixed by its number, and its
val_loss is a function of its learning rate alone. The helpers are shared with the CLI test.
"""

from __future__ import annotations

import json
import math
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
import pytest
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.config import ExperimentConfig, load_config
from muster.errors import Conflict, NotFound
from muster.services import importance
from muster.services.importance import Sample, experiment_importance, rank_importance
from muster.store import Experiment, Store, Trial
from tests.server.test_search_views import add_experiment, report

KEYS = {"experiment_id", "evaluator", "metric", "smaller_is_better", "ended_trials",
        "trials_used", "importances", "message"}
SPACE: dict[str, Any] = {
    "optimizer": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
    "noise": {"type": "double", "minval": 0, "maxval": 1},
    "model": {"layers": {"type": "int", "minval": 1, "maxval": 8},
              "act": {"type": "categorical", "vals": ["relu", "tanh"]}},
    "batch_size": 32,  # a constant: never ranked
}
# The searched hyperparameters as Optuna's distributions, written out by hand.
DISTRIBUTIONS: dict[str, BaseDistribution] = {
    "optimizer.lr": FloatDistribution(10.0**-4, 10.0**-1, log=True),
    "noise": FloatDistribution(0.0, 1.0),
    "model.layers": IntDistribution(1, 8),
    "model.act": CategoricalDistribution(["relu", "tanh"]),
}


# -- rows ---------------------------------------------------------------------------------


def importance_config(searcher: str = "random", metric: str | None = "val_loss",
                      smaller_is_better: bool = True, space: Mapping[str, Any] = SPACE,
                      ) -> dict[str, Any]:
    block: dict[str, Any] = {"name": searcher, "smaller_is_better": smaller_is_better}
    if metric is not None:
        block["metric"] = metric
    if searcher not in ("grid", "single"):
        block["max_trials"] = 100
    config = {"name": "importance", "entrypoint": ["python", "train.py"],
              "hyperparameters": dict(space), "searcher": block}
    return load_config(json.dumps(config), source="a test").to_json_dict()


def draw(number: int) -> dict[str, Any]:
    """Trial `number`'s values: pseudo-random, fixed by the number."""
    rng = random.Random(number)
    return {"optimizer.lr": 10 ** rng.uniform(-4, -1), "noise": rng.random(),
            "model.layers": rng.randint(1, 8), "model.act": rng.choice(["relu", "tanh"])}


def loss(params: Mapping[str, Any]) -> float:
    """val_loss: a function of the learning rate alone, best at 10^-2.5."""
    return float((math.log10(params["optimizer.lr"]) + 2.5) ** 2)


def add_searched_trial(s: Session, exp: Experiment, number: int, params: dict[str, Any],
                       state: str = "SUCCEEDED", *, reports: Sequence[dict[str, float]] = (),
                       early_stopped: bool = False) -> Trial:
    """A trial with the searcher's values and rank 0's validation reports (steps 1, 2, ...)."""
    space = ExperimentConfig.model_validate(exp.config).space()
    trial = Trial(experiment=exp, number=number, state=state, hparams=space.hparams(params),
                  search_state={"params": params}, early_stopped=early_stopped)
    s.add(trial)
    s.flush()
    for step, values in enumerate(reports, start=1):
        report(s, trial, step, values)
    return trial


def add_search(s: Session, trials: int, config: dict[str, Any] | None = None,
               value: Callable[[Mapping[str, Any]], float] = loss) -> Experiment:
    """A COMPLETED search whose trials all SUCCEEDED; each reported a worse val_loss first."""
    exp = add_experiment(s, config or importance_config(), state="COMPLETED", max_trials=100)
    for number in range(trials):
        params = draw(number)
        add_searched_trial(s, exp, number, params,
                           reports=[{"val_loss": value(params) + 1}, {"val_loss": value(params)}])
    return exp


def shares(answer: Mapping[str, Any]) -> dict[str, float]:
    return {row["name"]: row["importance"] for row in answer["importances"]}


def optuna_importances(samples: Sequence[tuple[dict[str, Any], float]],
                       smaller_is_better: bool = True) -> dict[str, float]:
    """What Optuna answers for an equivalent study of its own."""
    study = optuna.create_study(direction="minimize" if smaller_is_better else "maximize")
    for params, value in samples:
        study.add_trial(optuna.trial.create_trial(params=params, distributions=DISTRIBUTIONS,
                                                  value=value))
    return get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(),
                                 params=list(DISTRIBUTIONS))


@pytest.fixture
def store(shared_store: Store) -> Store:
    return shared_store


# -- the numbers --------------------------------------------------------------------------


def test_the_hyperparameter_that_drives_the_metric_ranks_first(store: Store) -> None:
    with store.session_scope() as s:
        exp = add_search(s, 60)
    answer = experiment_importance(store, exp.id)
    assert set(answer) == KEYS
    assert {key: answer[key] for key in KEYS - {"importances"}} == {
        "experiment_id": exp.id, "evaluator": "PedAnovaImportanceEvaluator",
        "metric": "val_loss", "smaller_is_better": True, "ended_trials": 60,
        "trials_used": 60, "message": None}
    found = shares(answer)
    assert next(iter(found)) == "optimizer.lr" and found["optimizer.lr"] > 0.5
    assert set(found) == set(DISTRIBUTIONS)  # the constant batch_size is not ranked
    assert math.isclose(sum(found.values()), 1.0)
    assert list(found.values()) == sorted(found.values(), reverse=True)
    assert PedAnovaImportanceEvaluator.__name__ == importance.EVALUATOR


@pytest.mark.parametrize("smaller_is_better", [True, False])
def test_the_numbers_are_optunas_own(store: Store, smaller_is_better: bool) -> None:
    """Each trial's value is its best report (the lowest val_loss, or the highest)."""
    config = importance_config(smaller_is_better=smaller_is_better)
    with store.session_scope() as s:
        exp = add_search(s, 40, config)
    best = [loss(draw(n)) + (0 if smaller_is_better else 1) for n in range(40)]
    expected = optuna_importances([(draw(n), best[n]) for n in range(40)], smaller_is_better)
    assert shares(experiment_importance(store, exp.id)) == expected


def test_the_same_trials_give_the_same_numbers() -> None:
    samples = [Sample(draw(n), loss(draw(n))) for n in range(200)]
    config = ExperimentConfig.model_validate(importance_config())
    first = rank_importance(1, samples, DISTRIBUTIONS, config.searcher)
    assert rank_importance(1, samples, DISTRIBUTIONS, config.searcher) == first
    assert dict(first.importances) == optuna_importances([(dict(x.params), x.value)
                                                           for x in samples])


def test_a_grid_search_is_ranked_over_its_points(store: Store) -> None:
    space = {"depth": {"type": "int", "minval": 1, "maxval": 6},
             "width": {"type": "categorical", "vals": [32, 64]}}
    with store.session_scope() as s:
        exp = add_experiment(s, importance_config("grid", space=space), state="COMPLETED",
                             max_trials=12)
        for number, (depth, width) in enumerate((d, w) for d in range(1, 7) for w in (32, 64)):
            add_searched_trial(s, exp, number, {"depth": depth, "width": width},
                               reports=[{"val_loss": float(depth)}])
    answer = experiment_importance(store, exp.id)
    assert [row["name"] for row in answer["importances"]] == ["depth", "width"]
    assert answer["trials_used"] == 12


def test_only_succeeded_trials_with_a_value_count(store: Store) -> None:
    """Early-stopped trials count; FAILED, CANCELED, SUSPECT and running ones do not, nor a
    success without a finite value of the metric; every ended one is counted as ended."""
    with store.session_scope() as s:
        exp = add_search(s, 12)
        add_searched_trial(s, exp, 12, draw(12), reports=[{"val_loss": 0.3}],
                           early_stopped=True)
        for number, state in enumerate(("FAILED", "CANCELED", "SUSPECT", "RUNNING"), start=13):
            add_searched_trial(s, exp, number, draw(number), state,
                               reports=[{"val_loss": 0.1}])
        add_searched_trial(s, exp, 17, draw(17), reports=[{"val_loss": math.nan}])
        add_searched_trial(s, exp, 18, draw(18), reports=[{"val_acc": 0.5}])
    answer = experiment_importance(store, exp.id)
    assert (answer["trials_used"], answer["ended_trials"]) == (13, 18)
    samples = [(draw(n), loss(draw(n))) for n in range(12)] + [(draw(12), 0.3)]
    assert shares(answer) == optuna_importances(samples)
    assert answer["message"] == (
        "only 13 trials: the top 10% that PED-ANOVA compares with the rest holds 2 of them, "
        "where Optuna advises at least 5; read these shares as rough until more trials end")


@pytest.mark.filterwarnings("error")  # and without a warning from Optuna
def test_a_tie_at_the_top_gives_equal_shares_and_says_why(store: Store) -> None:
    with store.session_scope() as s:
        exp = add_search(s, 20, value=lambda params: 0.25)
    answer = experiment_importance(store, exp.id)
    assert answer["importances"] == [{"name": name, "importance": 0.25}
                                     for name in sorted(DISTRIBUTIONS)]  # ties by name
    assert answer["message"] == ("20 of the 20 trials share the val_loss 0.25, so the top "
                                 "10% cannot be told from the rest: every hyperparameter "
                                 "gets an equal share")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna warns that the shares will be equal
        assert shares(answer) == optuna_importances([(draw(n), 0.25) for n in range(20)])


# -- errors -------------------------------------------------------------------------------


def test_without_a_searcher_metric(store: Store) -> None:
    """Only `single` may name none (every other searcher compares trials by it)."""
    config = importance_config("single", metric=None, space={"lr": 0.01})
    with store.session_scope() as s:
        exp = add_experiment(s, config, state="COMPLETED", max_trials=1)
    with pytest.raises(Conflict, match=rf"experiment {exp.id} has no searcher metric, so "
                                       r"there is nothing to rank .* `searcher.metric`"):
        experiment_importance(store, exp.id)


def test_too_few_trials_with_a_value(store: Store) -> None:
    with store.session_scope() as s:
        exp = add_search(s, 9)
        add_searched_trial(s, exp, 9, draw(9), "FAILED", reports=[{"val_loss": 0.1}])
    with pytest.raises(Conflict, match=rf"experiment {exp.id} has 9 SUCCEEDED trials with a "
                                       r"finite 'val_loss'; hyperparameter importance needs "
                                       r"at least 10, .* ask again when more have ended"):
        experiment_importance(store, exp.id)


def test_constants_only(store: Store) -> None:
    space = {"lr": 0.01, "layers": {"type": "int", "minval": 3, "maxval": 3}}
    with store.session_scope() as s:
        exp = add_experiment(s, importance_config(space=space), state="COMPLETED")
    with pytest.raises(Conflict, match="searches no hyperparameter: each is a constant"):
        experiment_importance(store, exp.id)


def test_no_hyperparameter_took_two_values(store: Store) -> None:
    with store.session_scope() as s:
        exp = add_experiment(s, importance_config(), state="COMPLETED")
        for number in range(10):
            add_searched_trial(s, exp, number, draw(0), reports=[{"val_loss": number}])
    with pytest.raises(Conflict, match=r"no hyperparameter .* took two values in its 10 "
                                       r"trials with a 'val_loss'"):
        experiment_importance(store, exp.id)


def test_unknown_experiment(store: Store) -> None:
    with pytest.raises(NotFound):
        experiment_importance(store, 10**9)


# -- the cache ----------------------------------------------------------------------------


def test_an_answer_is_kept_until_another_trial_ends(store: Store) -> None:
    with store.session_scope() as s:
        exp = add_search(s, 30)
        first = s.scalars(select(Trial.id).where(Trial.experiment_id == exp.id,
                                                 Trial.number == 0)).one()
    before = experiment_importance(store, exp.id)
    with store.session_scope() as s:  # trial 0 becomes the best by far: the same key
        report(s, s.get_one(Trial, first), 3, {"val_loss": -100.0})
    assert experiment_importance(store, exp.id) == before
    with store.session_scope() as s:
        add_searched_trial(s, s.get_one(Experiment, exp.id), 30, draw(30), "FAILED")
    after = experiment_importance(store, exp.id)
    assert (before["ended_trials"], after["ended_trials"]) == (30, 31)
    samples = [(draw(n), loss(draw(n))) for n in range(30)]
    samples[0] = (draw(0), -100.0)
    assert shares(after) == optuna_importances(samples) != shares(before)


def test_a_suspect_trial_accepted_on_review_counts_at_once(store: Store) -> None:
    with store.session_scope() as s:
        exp = add_search(s, 10)
        suspect = add_searched_trial(s, exp, 10, draw(10), "SUSPECT",
                                     reports=[{"val_loss": 0.5}])
    assert experiment_importance(store, exp.id)["trials_used"] == 10
    with store.session_scope() as s:
        s.get_one(Trial, suspect.id).state = "SUCCEEDED"
    answer = experiment_importance(store, exp.id)
    assert (answer["ended_trials"], answer["trials_used"]) == (11, 11)
