"""resources.memory_limit: a size per replica, as people write sizes; distributed_env."""

from __future__ import annotations

import pytest

from muster.config import ExperimentConfig, load_config
from muster.states import DistributedEnv
from tests.config.test_loading import one_problem

HEAD = "name: x\nentrypoint: python t.py\n"


@pytest.mark.parametrize(
    ("written", "size"),
    [
        ("4GiB", 4 << 30),
        ("150MiB", 150 << 20),
        ("1.5GB", 1_500_000_000),
        ("'512 mib'", 512 << 20),
        ("1048576", 1 << 20),
    ],
)
def test_memory_limit_is_a_size(written: str, size: int) -> None:
    config = load_config(HEAD + f"resources: {{memory_limit: {written}}}")
    assert config.resources.memory_limit == size
    assert ExperimentConfig.from_json_dict(config.to_json_dict()) == config


def test_without_a_memory_limit_there_is_none() -> None:
    assert load_config(HEAD).resources.memory_limit is None
    assert load_config(HEAD + "resources: {memory_limit: null}").resources.memory_limit is None


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ("4 gigs", "must look like '4GiB', '512MiB' or '1.5GB', got '4 gigs'"),
        ("-1GiB", "must look like '4GiB', '512MiB' or '1.5GB', got '-1GiB'"),
        ("4", "must be at least 1MiB (write a unit, e.g. '4GiB'), got 4"),
        ("0.5KiB", "must be at least 1MiB (write a unit, e.g. '4GiB'), got '0.5KiB'"),
        ("true", "must look like '4GiB', '512MiB' or '1.5GB', got True"),
    ],
)
def test_a_bad_memory_limit_says_what_it_must_look_like(written: str, problem: str) -> None:
    assert one_problem(f"resources: {{memory_limit: {written}}}") == (
        f"resources.memory_limit: {problem}"
    )


@pytest.mark.parametrize("written", ["auto", "always", "never"])
def test_distributed_env_is_one_of_three_words(written: str) -> None:
    config = load_config(HEAD + f"resources: {{distributed_env: {written}}}")
    assert config.resources.distributed_env is DistributedEnv(written)
    assert ExperimentConfig.from_json_dict(config.to_json_dict()) == config
    assert load_config(HEAD).resources.distributed_env is DistributedEnv.AUTO


@pytest.mark.parametrize(("written", "shown"), [
    ("sometimes", "'sometimes'"), ("Always", "'Always'"), ("true", "true"), ("2", "2")])
def test_a_bad_distributed_env_names_the_three_words(written: str, shown: str) -> None:
    assert one_problem(f"resources: {{distributed_env: {written}}}") == (
        f"resources.distributed_env: must be 'auto', 'always' or 'never', got {shown}")
