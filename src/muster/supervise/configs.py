"""Stored experiment configs, validated once per experiment."""

from __future__ import annotations

from collections import OrderedDict

from muster.config import ExperimentConfig
from muster.store import Experiment

_CONFIGS: OrderedDict[str, ExperimentConfig] = OrderedDict()
_CONFIGS_KEPT = 4096


def experiment_config(experiment: Experiment) -> ExperimentConfig:
    """The experiment's config, validated once (a stored config never changes; the uuid is
    unique across databases), the most recent few thousand kept."""
    config = _CONFIGS.get(experiment.uuid)
    if config is None:
        config = ExperimentConfig.model_validate(experiment.config)
        _CONFIGS[experiment.uuid] = config
        if len(_CONFIGS) > _CONFIGS_KEPT:
            _CONFIGS.popitem(last=False)
    else:
        _CONFIGS.move_to_end(experiment.uuid)
    return config
