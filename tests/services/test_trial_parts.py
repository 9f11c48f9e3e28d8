"""The snapshot in describe answers (`snapshots.TrialParts`) and the trial that stands for an
experiment in an experiment diff (`snapshots.stand_in`), on the real store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from muster.config.schema import SearcherConfig
from muster.environments.layout import RECORD
from muster.errors import Conflict, NotFound
from muster.home import Home
from muster.services.experiments import describe_experiment, describe_trial
from muster.services.snapshots import TrialParts, diff_experiments, stand_in
from muster.states import Basis
from muster.store import Experiment, Store, Trial

KEY = "0123456789abcdef"  # an environment's hash
FREEZE = "numpy==1.26.4\nTorch==2.3.0\n"


@pytest.fixture
def store(shared_store: Store) -> Store:
    return shared_store


def built_environment(home: Home, key: str, freeze: str) -> None:
    """A built environment as `muster.environments` publishes it: a link to a venv whose
    record holds `env.json` and its `pip freeze`."""
    venv = home.envs_dir / "store" / key
    (venv / RECORD).mkdir(parents=True)
    (venv / RECORD / "env.json").write_text("{}")
    (venv / RECORD / "freeze.txt").write_text(freeze)
    (home.envs_dir / key).symlink_to(venv)


def add_experiment(store: Store, trials: int, environment: str | None = None,
                   searcher: dict[str, Any] | None = None) -> tuple[int, list[int]]:
    config = {"name": "parts", "entrypoint": ["true"], "hyperparameters": {"lr": 0.1},
              "searcher": searcher or {"name": "single"}}
    with store.session_scope() as s:
        exp = Experiment(name="parts", config=config, config_yaml=json.dumps(config),
                         context_dir="/nonexistent/context", state="ACTIVE",
                         environment_key=environment)
        rows = [Trial(experiment=exp, state="QUEUED", number=n, hparams={"lr": 0.1 * (n + 1)})
                for n in range(trials)]
        s.add_all([exp, *rows])
        s.flush()
        return exp.id, [t.id for t in rows]


def test_an_experiment_s_trials_share_one_read_of_its_environment(
        store: Store, tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    built_environment(home, KEY, FREEZE)
    experiment_id, trial_ids = add_experiment(store, 3, environment=KEY)
    trials = describe_experiment(store, experiment_id, TrialParts(home))["trials"]
    parts = [t["snapshot"] for t in trials]
    assert [p["hparams"] for p in parts] == [{"lr": 0.1}, {"lr": 0.2}, {"lr": pytest.approx(0.3)}]
    assert parts[0]["environment"] == {"key": KEY,
                                       "packages": {"numpy": "1.26.4", "torch": "2.3.0"}}
    # Read once for the answer: every trial holds the same objects, not copies of rereads.
    assert all(p["environment"]["packages"] is parts[0]["environment"]["packages"]
               for p in parts)
    assert all(p["config"] is parts[0]["config"] for p in parts)
    assert len(parts[0]["code"]["tree_sha256"]) == 64
    single = describe_trial(store, trial_ids[1], TrialParts(home))["snapshot"]
    assert single == parts[1]


def test_a_describe_without_parts_shows_a_null_snapshot(store: Store) -> None:
    experiment_id, (trial_id,) = add_experiment(store, 1)
    assert describe_trial(store, trial_id)["snapshot"] is None
    assert describe_experiment(store, experiment_id)["trials"][0]["snapshot"] is None


def test_a_stored_config_no_longer_valid_is_shown_as_stored(store: Store,
                                                            tmp_path: Path) -> None:
    with store.session_scope() as s:  # a config from before a schema change: no entrypoint
        exp = Experiment(name="old", config={"name": "old", "gone": 1}, config_yaml="",
                         context_dir="/nonexistent/context", state="COMPLETED")
        trial = Trial(experiment=exp, state="SUCCEEDED", number=0, hparams={})
        s.add_all([exp, trial])
        s.flush()
        trial_id = trial.id
    part = describe_trial(store, trial_id, TrialParts(Home(tmp_path / "home")))["snapshot"]
    assert (part["config"], part["seed"]) == ({"name": "old", "gone": 1}, None)


def test_an_experiment_without_a_trial_cannot_be_compared(store: Store,
                                                          tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    empty, _ = add_experiment(store, 0)
    other, _ = add_experiment(store, 1)
    with pytest.raises(Conflict, match=f"experiment {empty} has no trial yet"):
        diff_experiments(store, home, other, empty)
    with pytest.raises(NotFound, match="experiment 2147483647 does not exist"):
        diff_experiments(store, home, 2147483647, other)


# -- which trial stands for an experiment (pure) ------------------------------------------

METRIC = SearcherConfig.model_validate({"name": "random", "metric": "val_loss",
                                        "max_trials": 8})
NO_METRIC = SearcherConfig.model_validate({"name": "single"})


def trial(number: int, state: str = "SUCCEEDED") -> Trial:
    return Trial(id=100 + number, number=number, state=state)


TRIALS = [trial(0), trial(1), trial(2, "RUNNING"), trial(3, "FAILED")]


@pytest.mark.parametrize(("trials", "best", "searcher", "expected"), [
    (TRIALS, {100: {"val_loss": 0.4}, 101: {"val_loss": 0.2}}, METRIC, (101, Basis.BEST)),
    # a better value of a trial that has not succeeded does not count
    (TRIALS, {100: {"val_loss": 0.4}, 102: {"val_loss": 0.1}}, METRIC, (100, Basis.BEST)),
    (TRIALS, {}, METRIC, (103, Basis.LATEST)),
    (TRIALS, {100: {"val_loss": 0.4}}, NO_METRIC, (103, Basis.LATEST)),
    ([trial(0, "QUEUED")], {}, NO_METRIC, (100, Basis.LATEST)),
    ([], {}, METRIC, None),
], ids=["best", "best-succeeded", "no-value", "no-metric", "one-trial", "no-trial"])
def test_the_trial_that_stands_for_an_experiment(
        trials: list[Trial], best: dict[int, dict[str, float]], searcher: SearcherConfig,
        expected: tuple[int, Basis] | None) -> None:
    chosen = stand_in(trials, best, searcher)
    assert (None if chosen is None else (chosen[0].id, chosen[1])) == expected
