"""Experiment and cluster configs: schemas, YAML loading, errors that name the key path."""

from muster.config.cluster import (
    ClusterConfig,
    FakeGpuConfig,
    GpuReleaseConfig,
    NodeQuarantineConfig,
    RayConfig,
    load_cluster_config,
)
from muster.config.loading import load_config, load_config_file
from muster.config.schema import (
    DataConfig,
    DiagnosticsConfig,
    EnvironmentConfig,
    ExpectedLength,
    ExperimentConfig,
    FailurePolicy,
    ManifestConfig,
    ResourcesConfig,
    VerifyConfig,
)
from muster.config.units import parse_duration, parse_size

__all__ = [
    "ClusterConfig",
    "DataConfig",
    "DiagnosticsConfig",
    "EnvironmentConfig",
    "ExpectedLength",
    "ExperimentConfig",
    "FailurePolicy",
    "FakeGpuConfig",
    "GpuReleaseConfig",
    "ManifestConfig",
    "NodeQuarantineConfig",
    "RayConfig",
    "ResourcesConfig",
    "VerifyConfig",
    "load_cluster_config",
    "load_config",
    "load_config_file",
    "parse_duration",
    "parse_size",
]
