"""The experiment config: what a person writes in YAML, validated into frozen models.

Models are strict (no silent `"5"` -> 5 or `true` -> 1) and forbid unknown keys, so a typo
is an error, never a default quietly used. Keys that ARCHITECTURE.md plans but this version
does not implement are listed in each model's `PLANNED_KEYS`; they are rejected with a
message that says so (see `muster.config.problems`), not as unknown keys.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from muster.config import space
from muster.config.problems import KeyedProblems, show_value, validate_config_data
from muster.config.units import parse_duration, parse_size

__all__ = [
    "DataConfig",
    "EnvironmentConfig",
    "ExperimentConfig",
    "FailurePolicy",
    "ManifestConfig",
    "ReproducibilityConfig",
    "ResourcesConfig",
    "SearcherConfig",
    "VerifyConfig",
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    PLANNED_KEYS: ClassVar[frozenset[str]] = frozenset()


class EnvironmentConfig(_Section):
    """Extra environment variables for every replica, on top of muster's own."""

    PLANNED_KEYS: ClassVar[frozenset[str]] = frozenset({"python"})

    variables: dict[str, str] = Field(default_factory=dict)

    @field_validator("variables", mode="before")
    @classmethod
    def _scalars_to_strings(cls, value: object) -> object:
        """YAML reads `OMP_NUM_THREADS: 1` as an int; the environment only holds strings."""
        if not isinstance(value, Mapping):
            return value
        return {_env_text(k): _env_text(v) for k, v in value.items()}

    @field_validator("variables")
    @classmethod
    def _valid_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a valid environment variable name "
                    "(letters, digits and '_', not starting with a digit)"
                )
        return value


class FailurePolicy(_Section):
    """How many times each kind of failure is retried; see ARCHITECTURE.md's table."""

    replica_restarts: int = Field(default=5, ge=0)
    trial_retries: int = Field(default=3, ge=0)
    internal_retries: int = Field(default=2, ge=0)
    retry_user_errors: int = Field(default=0, ge=0)
    restart_scope: Literal["trial", "replica"] = "trial"
    transient_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(default_factory=list)
    stop_grace: float = Field(default=30.0, ge=0)
    # SIGTERM -> SIGKILL for the survivors once another replica has failed: their collectives
    # are broken (a rank blocked in one never sees should_stop()), so waiting only delays
    # the restart.
    failure_grace: float = Field(default=2.0, ge=0)
    # Start the next attempt's replicas ahead, waiting in muster.harness.init(), so that a
    # restart does not pay the script's start-up (imports, data) again.
    warm_standby: bool = False
    heartbeat_timeout: float = Field(default=300.0, gt=0)

    @field_validator("stop_grace", "failure_grace", "heartbeat_timeout", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)


class ManifestConfig(_Section):
    """What the data manifest counts: files with these extensions; classes from folders."""

    extensions: list[str] | None = None
    labels: Literal["from_dirs", "none"] = "none"

    @field_validator("extensions")
    @classmethod
    def _dotted(cls, value: list[str] | None) -> list[str] | None:
        """`png` and `.PNG` both mean `.png`: extensions compare case-insensitively."""
        if value is None:
            return None
        if not value:
            raise ValueError("must list at least one extension, or be left out to count all")
        return [("" if ext.startswith(".") else ".") + ext.lower() for ext in value]


class DataConfig(_Section):
    """The training data muster scans before launch, independently of the training code."""

    path: str = Field(min_length=1)
    manifest: ManifestConfig = Field(default_factory=ManifestConfig)


MAX_REPLICAS = 64
MIN_MEMORY_LIMIT = 1 << 20


MIN_PRIORITY, DEFAULT_PRIORITY, MAX_PRIORITY = 1, 42, 99
MAX_GPUS_PER_REPLICA = 64


class ResourcesConfig(_Section):
    """What each trial runs on: how many replicas (ranks) start and stop together, how much
    memory each replica's processes may use together (bytes; None: no limit), how many GPUs
    each replica gets (of which type), the experiment's cap on replicas running at once,
    and its place in the queue (priority 1-99, lower runs first, as in Determined)."""

    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    memory_limit: int | None = None
    gpus_per_replica: int = Field(default=0, ge=0, le=MAX_GPUS_PER_REPLICA)
    gpu_type: str | None = Field(default=None, min_length=1)
    max_slots: int | None = Field(default=None, ge=1)
    priority: int = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)

    @field_validator("gpu_type")
    @classmethod
    def _lower(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Types compare case-insensitively: `A100` and `a100` are one type."""
        if value is None:
            return None
        if info.data.get("gpus_per_replica") == 0:
            raise ValueError(f"is {value!r}, but resources.gpus_per_replica is 0: set how many "
                             "GPUs each replica needs, or leave gpu_type out")
        return value.strip().lower()

    @field_validator("max_slots")
    @classmethod
    def _fits_one_trial(cls, value: int | None, info: ValidationInfo) -> int | None:
        replicas = info.data.get("replicas")
        if value is not None and isinstance(replicas, int) and value < replicas:
            raise ValueError(f"is {value}, fewer than one trial's {replicas} replicas: no "
                             "trial could ever start; raise it or lower resources.replicas")
        return value

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _size(cls, value: object) -> int | None:
        """`4GiB`, `512MiB` or a number of bytes; a bare small number is surely a mistake."""
        if value is None:
            return None
        size = parse_size(value)
        if size < MIN_MEMORY_LIMIT:
            raise ValueError(f"must be at least 1MiB (write a unit, e.g. '4GiB'), got {value!r}")
        return size


class VerifyConfig(_Section):
    """The checks that must pass before an exit 0 counts as SUCCEEDED (else SUSPECT)."""

    samples_tolerance: float = Field(default=0.01, ge=0, le=1)
    expected_samples: int | None = Field(default=None, ge=1)
    require_checkpoint: bool | None = None  # None: required when the harness was used
    finite_metrics: bool = True
    require_metrics: list[str] = Field(default_factory=list)


SEARCHERS = ("single", "grid", "random", "tpe", "asha", "adaptive_asha")
PRUNING_SEARCHERS = frozenset({"asha", "adaptive_asha"})  # they stop trials early
MAX_TRIALS = 10_000
# Settings that only some searchers read: which, so that a setting a searcher would ignore
# is an error rather than a silent no-op.
_ONLY_FOR = {
    "mode": ("adaptive_asha",),
    "divisor": ("asha", "adaptive_asha"),
    "max_rungs": ("asha", "adaptive_asha"),
}


class SearcherConfig(_Section):
    """How the experiment's trials are chosen (Determined's `searcher` block): `single` runs
    one trial; the others sample `hyperparameters` (Optuna samplers and pruners)."""

    name: Literal["single", "grid", "random", "tpe", "asha", "adaptive_asha"] = "single"
    metric: str | None = Field(default=None, min_length=1)
    smaller_is_better: bool = True
    max_trials: int | None = Field(default=None, ge=1, le=MAX_TRIALS)
    max_concurrent_trials: int = Field(default=16, ge=1)
    max_length: int | None = Field(default=None, ge=1)  # in report_validation's step units
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    divisor: int = Field(default=4, ge=2, le=100)
    max_rungs: int = Field(default=5, ge=1, le=20)

    def prunes(self) -> bool:
        """Whether this searcher stops poor trials early (its pruner judges validation)."""
        return self.name in PRUNING_SEARCHERS

    @model_validator(mode="after")
    def _complete(self) -> SearcherConfig:
        problems = _searcher_problems(self)
        if problems:
            raise KeyedProblems(problems)
        return self


def _searcher_problems(config: SearcherConfig) -> list[tuple[str, str]]:
    name = config.name
    # A stored config holds every default, so only a value other than the default is one
    # the person set for a searcher that ignores it.
    problems = [(key, f"only the {' and '.join(searchers)} searcher"
                      + (" uses" if len(searchers) == 1 else "s use")
                      + f" it, not {name}; remove it")
                for key, searchers in _ONLY_FOR.items()
                if name not in searchers
                and getattr(config, key) != SearcherConfig.model_fields[key].default]
    if name != "single" and config.metric is None:
        problems.append(("metric", f"required by the {name} searcher, which compares trials by "
                                   "a validation metric: name one the script reports with "
                                   "report_validation, e.g. `metric: val_loss`"))
    if name == "single" and config.max_trials not in (None, 1):
        problems.append(("max_trials", "the single searcher runs one trial; choose random, "
                                       "tpe, asha or adaptive_asha to run more"))
    if name == "grid" and config.max_trials is not None:
        problems.append(("max_trials", "a grid runs one trial per point (the product of the "
                                       "counts); remove max_trials"))
    if name in ("random", "tpe", "asha", "adaptive_asha") and config.max_trials is None:
        problems.append(("max_trials", f"required by the {name} searcher: how many trials to "
                                       "run in all"))
    if name in ("asha", "adaptive_asha") and config.max_length is None:
        problems.append(("max_length", f"required by {name}, whose rungs are fractions of it "
                                       "(in the steps the script reports validation with)"))
    return problems


class ReproducibilityConfig(_Section):
    """`experiment_seed` seeds the searcher: the same seed draws the same hyperparameters."""

    PLANNED_KEYS: ClassVar[frozenset[str]] = frozenset({"deterministic"})

    experiment_seed: int | None = Field(default=None, ge=0, le=2**31 - 1)


class ExperimentConfig(_Section):
    """One experiment: what to run, in which environment, and how to handle failures."""

    PLANNED_KEYS: ClassVar[frozenset[str]] = frozenset({"checkpoint_storage"})

    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    labels: list[str] = Field(default_factory=list)
    entrypoint: list[str] = Field(min_length=1)
    # The entrypoint calls muster.harness.init() on every rank. muster cannot know that
    # before the script runs; said here, RUNNING waits for every rank's check-in, a rank
    # that never checks in is STALLED, and verification expects what the harness records.
    harness: bool = False
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    data: DataConfig | None = None
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    # Mappings, `{type: ...}` ranges and constants; `muster.config.space` says what each is.
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    searcher: SearcherConfig = Field(default_factory=SearcherConfig)
    reproducibility: ReproducibilityConfig = Field(default_factory=ReproducibilityConfig)

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _argv(cls, value: object) -> object:
        """A string is split like a shell would split it, but never run by a shell."""
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot be split into arguments: {exc}") from None
        if not isinstance(value, list):
            raise ValueError(
                f"must be a command line string or a list of arguments, got {show_value(value)}"
            )
        return value

    @field_validator("hyperparameters")
    @classmethod
    def _space(cls, value: dict[str, Any]) -> dict[str, Any]:
        space.parse(value)  # raises SpaceProblems, each with its key path
        return value

    @model_validator(mode="after")
    def _searchable(self) -> ExperimentConfig:
        """The searcher and the space fit together (a grid needs counts; a search needs
        something to choose)."""
        searcher, parsed = self.searcher, self.space()
        searched = parsed.searched()
        if searcher.name == "single" and searched:
            first = next(iter(searched))
            raise KeyedProblems([(
                f"hyperparameters.{first}", "the single searcher runs one trial with fixed "
                "values, and this is a range: make it a constant, or search it, e.g. with "
                "`searcher: {name: random, max_trials: 1, metric: ...}`")])
        if searcher.name == "single":
            return self
        if not searched:
            raise KeyedProblems([(
                "searcher.name", f"the {searcher.name} searcher needs at least one "
                "hyperparameter to choose (int, double, log or categorical) under "
                "`hyperparameters`; with only constants use `name: single`")])
        problems = parsed.grid_problems() if searcher.name == "grid" else []
        if problems:
            raise KeyedProblems([(f"hyperparameters.{path}", problem)
                                 for path, problem in problems])
        return self

    def space(self) -> space.SearchSpace:
        """The parsed search space (validated when the config was)."""
        return space.parse(self.hyperparameters)

    def trial_count(self) -> int:
        """How many trials the experiment runs: 1, a grid's size, or `max_trials`."""
        if self.searcher.name == "single":
            return 1
        if self.searcher.name == "grid":
            return self.space().grid_size()
        assert self.searcher.max_trials is not None, "checked by SearcherConfig"
        return self.searcher.max_trials

    @field_validator("failure_policy")
    @classmethod
    def _standby_needs_harness(cls, value: FailurePolicy, info: ValidationInfo) -> FailurePolicy:
        if value.warm_standby and info.data.get("harness") is False:
            raise ValueError(
                "warm_standby: true needs `harness: true` at the top level: a standby waits "
                "in muster.harness.init(), and a script that never calls it would run its "
                "training twice. Call mh.init() on every rank and set `harness: true`, or "
                "drop warm_standby"
            )
        return value

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data, for the store and the API; `from_json_dict` reads it back."""
        return self.model_dump(mode="json")

    @classmethod
    def from_json_dict(
        cls, data: Mapping[str, Any], source: str = "<stored config>"
    ) -> ExperimentConfig:
        """Rebuild a config from `to_json_dict` output (or any plain data).

        Raises:
            ConfigError: the data is not a valid config, one problem per line.
        """
        return validate_config_data(cls, dict(data), source)


def _env_text(value: object) -> object:
    """YAML scalars as the person wrote them: `true` -> "true" (not "True"), 1.5 -> "1.5"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value
