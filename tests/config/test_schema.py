"""The experiment config models: defaults, conversions, and the stored-JSON round trip."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from muster.config import EnvironmentConfig, ExperimentConfig, FailurePolicy
from muster.errors import ConfigError


def minimal(**extra: Any) -> dict[str, Any]:
    return {"name": "digits", "entrypoint": "python train.py", **extra}


def test_defaults_follow_the_architecture_table() -> None:
    config = ExperimentConfig.model_validate(minimal())
    assert config.description == ""
    assert config.labels == []
    assert config.environment == EnvironmentConfig(variables={})
    assert config.failure_policy == FailurePolicy(
        replica_restarts=5,
        trial_retries=3,
        internal_retries=2,
        retry_user_errors=0,
        restart_scope="trial",
        transient_exit_codes=[],
        stop_grace=30.0,
    )


@pytest.mark.parametrize(
    ("entrypoint", "argv"),
    [
        ("python train.py --epochs 5", ["python", "train.py", "--epochs", "5"]),
        ("python train.py --name 'two words'", ["python", "train.py", "--name", "two words"]),
        ('sh -c "echo $HOME; exit 3"', ["sh", "-c", "echo $HOME; exit 3"]),
        ("python a.py | tee log", ["python", "a.py", "|", "tee", "log"]),  # never a shell
        (
            ["python", "train.py", "--name", "two words"],
            ["python", "train.py", "--name", "two words"],
        ),
        (["it's", "$HOME", "a b"], ["it's", "$HOME", "a b"]),  # a list is used as is
    ],
)
def test_entrypoint_string_is_split_and_list_used_as_is(
    entrypoint: str | list[str], argv: list[str]
) -> None:
    assert ExperimentConfig.model_validate(minimal(entrypoint=entrypoint)).entrypoint == argv


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"OMP_NUM_THREADS": 1}, {"OMP_NUM_THREADS": "1"}),
        ({"LR": 1.5}, {"LR": "1.5"}),
        ({"DEBUG": True, "QUIET": False}, {"DEBUG": "true", "QUIET": "false"}),
        ({"TEXT": "as is"}, {"TEXT": "as is"}),
        ({"_private": "x", "A1": ""}, {"_private": "x", "A1": ""}),
    ],
)
def test_environment_scalars_become_strings(
    variables: dict[str, object], expected: dict[str, str]
) -> None:
    config = ExperimentConfig.model_validate(minimal(environment={"variables": variables}))
    assert config.environment.variables == expected


@pytest.mark.parametrize(
    ("value", "seconds"), [("30s", 30.0), ("1m30s", 90.0), (5, 5.0), (0.5, 0.5), ("0s", 0.0)]
)
def test_stop_grace_accepts_durations(value: object, seconds: float) -> None:
    assert FailurePolicy.model_validate({"stop_grace": value}).stop_grace == seconds


def test_models_are_frozen() -> None:
    config = ExperimentConfig.model_validate(minimal())
    with pytest.raises(ValueError, match="frozen"):
        config.name = "other"  # type: ignore[misc]


def test_json_round_trip() -> None:
    config = ExperimentConfig.model_validate(
        minimal(
            description="d",
            labels=["a", "b"],
            environment={"variables": {"A": 1}},
            failure_policy={
                "transient_exit_codes": [75],
                "stop_grace": "1m",
                "retry_user_errors": 1,
            },
        )
    )
    data = config.to_json_dict()
    assert data["entrypoint"] == ["python", "train.py"]
    assert data["failure_policy"]["stop_grace"] == 60.0
    assert data["environment"] == {"variables": {"A": "1"}, "secrets": {}, "python": None,
                                   "pip": [], "requirements": None, "inherit": None,
                                   "setup": []}
    assert ExperimentConfig.from_json_dict(data) == config


def test_from_json_dict_reports_problems_as_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        ExperimentConfig.from_json_dict({"name": "x", "entrypoint": [],
                                         "checkpoint_storage": {"type": "gcs"}})
    message = str(info.value)
    assert "entrypoint: must not be empty" in message
    assert "checkpoint_storage.type: " in message and "'gcs'" in message
    assert "pydantic" not in message


_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
_SCALARS = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.text(max_size=10))


@given(st.dictionaries(_NAMES, _SCALARS, max_size=5))
def test_any_yaml_scalar_variable_round_trips(variables: dict[str, object]) -> None:
    config = ExperimentConfig.model_validate(minimal(environment={"variables": variables}))
    assert set(config.environment.variables) == set(variables)
    assert all(isinstance(v, str) for v in config.environment.variables.values())
    assert ExperimentConfig.from_json_dict(config.to_json_dict()) == config
