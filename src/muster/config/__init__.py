"""Experiment configs: the schema, YAML loading, and errors that name the key path."""

from muster.config.loading import load_config, load_config_file
from muster.config.schema import (
    DataConfig,
    EnvironmentConfig,
    ExperimentConfig,
    FailurePolicy,
    ManifestConfig,
    ResourcesConfig,
    VerifyConfig,
)
from muster.config.units import parse_duration, parse_size

__all__ = [
    "DataConfig",
    "EnvironmentConfig",
    "ExperimentConfig",
    "FailurePolicy",
    "ManifestConfig",
    "ResourcesConfig",
    "VerifyConfig",
    "load_config",
    "load_config_file",
    "parse_duration",
    "parse_size",
]
