"""store/configs.py: a stored config is validated once, and never answered from a kept value
made from other JSON than the row holds now."""

from __future__ import annotations

from sqlalchemy import inspect, select
from sqlalchemy.orm import defer

from muster.store import Experiment, Store
from muster.store.configs import experiment_config, experiment_searcher, kept_config
from tests.store.rows import add_experiment

CONFIG = {"name": "x", "entrypoint": ["python", "train.py"],
          "searcher": {"name": "single", "metric": "val_loss"}}


def _stored(store: Store, config: dict[str, object]) -> int:
    with store.session_scope() as s:
        experiment = add_experiment(s)
        experiment.config = config
        return experiment.id


def test_a_config_rewritten_under_the_server_is_read_again(store: Store) -> None:
    experiment_id = _stored(store, CONFIG)
    with store.session_scope() as s:
        experiment = s.get(Experiment, experiment_id)
        assert experiment is not None
        first = experiment_config(experiment)
        assert experiment_config(experiment) is first  # kept: validated once
        assert experiment_searcher(experiment).metric == "val_loss"
        experiment.config = {**CONFIG, "searcher": {"name": "single", "metric": "accuracy"}}
    with store.session_scope() as s:
        experiment = s.get(Experiment, experiment_id)
        assert experiment is not None
        assert experiment_config(experiment).searcher.metric == "accuracy"
        assert experiment_searcher(experiment).metric == "accuracy"


def test_a_row_whose_config_was_not_loaded_is_answered_from_the_kept_one(store: Store) -> None:
    experiment_id = _stored(store, CONFIG)
    with store.session_scope() as s:
        experiment = s.get(Experiment, experiment_id)
        assert experiment is not None
        kept = experiment_config(experiment)
        uuid = experiment.uuid
    with store.session_scope() as s:
        row = s.scalars(select(Experiment).options(defer(Experiment.config))
                        .where(Experiment.id == experiment_id)).one()
        assert experiment_config(row) is kept is kept_config(uuid)
        assert "config" in inspect(row).unloaded  # and no query read it
