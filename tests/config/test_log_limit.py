"""`resources.log_limit` and the cluster config's default: sizes, `off`, and which wins."""

from __future__ import annotations

import pytest

from muster.config import load_config
from muster.config.cluster import DEFAULT_LOG_LIMIT, ClusterConfig
from muster.config.schema import ResourcesConfig
from muster.errors import ConfigError

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize(("written", "stored"), [
    ("1MiB", MiB), ("10GiB", 10 * GiB), ("1.5GB", 1_500_000_000), (4 * MiB, 4 * MiB),
    ("off", "off"), ("OFF", "off"), (False, "off"),  # YAML reads a bare off as false
])
def test_an_experiment_log_limit_is_a_size_or_off(written: object, stored: object) -> None:
    assert ResourcesConfig.model_validate({"log_limit": written}).log_limit == stored


@pytest.mark.parametrize(("written", "problem"), [
    (4096, "must be at least 1MiB (write a unit, e.g. '10GiB'), got 4096"),
    ("lots", "must be a size such as '10GiB', or 'off' to keep all output, got 'lots'"),
    (True, "must be a size such as '10GiB', or 'off' to keep all output, got True"),
])
def test_a_log_limit_that_is_neither_names_the_key_and_the_fix(written: object,
                                                                problem: str) -> None:
    text = f"name: x\nentrypoint: python t.py\nresources: {{log_limit: {written!r}}}\n"
    with pytest.raises(ConfigError) as caught:
        load_config(text.replace("'", "") if isinstance(written, int) else text)
    assert f"resources.log_limit: {problem}" in str(caught.value)


@pytest.mark.parametrize(("experiment", "cluster", "limit"), [
    (None, DEFAULT_LOG_LIMIT, DEFAULT_LOG_LIMIT),  # the cluster's default
    (None, None, None),  # the cluster's `off`
    (MiB, None, MiB),  # the experiment's own wins
    ("off", DEFAULT_LOG_LIMIT, None),
])
def test_the_experiment_s_limit_wins_over_the_cluster_s_default(
        experiment: object, cluster: int | None, limit: int | None) -> None:
    resources = ResourcesConfig.model_validate({"log_limit": experiment})
    assert resources.log_limit_bytes(cluster) == limit


def test_the_cluster_default_is_ten_gib_and_may_be_off_or_a_size() -> None:
    assert ClusterConfig().log_limit == DEFAULT_LOG_LIMIT == 10 * GiB
    assert ClusterConfig.model_validate({"log_limit": "off"}).log_limit is None
    assert ClusterConfig.model_validate({"log_limit": "2GiB"}).log_limit == 2 * GiB
