"""The experiment config: what a person writes in YAML, validated into frozen models.

Models are strict (no silent `"5"` -> 5 or `true` -> 1) and forbid unknown keys, so a typo
is an error, never a default quietly used. Keys that ARCHITECTURE.md plans but this version
does not implement are listed in each model's `PLANNED_KEYS`; they are rejected with a
message that says so (see `muster.config.problems`), not as unknown keys. Keys of a
Determined AI config that muster spells differently or does not have are in `FOREIGN_KEYS`,
each with a hint that names muster's way (Determined users bring their configs along).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from muster.config import space
from muster.config.problems import KeyedProblems, show_value, validate_config_data
from muster.config.secrets import source_of
from muster.config.space import WrittenSpace
from muster.config.units import parse_duration, parse_size
from muster.jobenv import MUSTER_PREFIX
from muster.metrics_lines import name_problem
from muster.priority import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from muster.states import DistributedEnv

__all__ = [
    "SUBMISSION",
    "CheckpointStorageConfig",
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
MAX_SECRETS = 100
_TRIAL_CLASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # model_def:MNistTrial


# The validation context of a config being submitted. Rules added after configs were stored
# (metric and hyperparameter names: `muster.metrics_lines.NAME_RULE`) judge what is submitted
# from now on; a stored config is read back (`model_validate(stored)`) as it was accepted,
# so an experiment made before a rule still runs and shows.
SUBMISSION: dict[str, bool] = {"submission": True}


def _submitted(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("submission"))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    PLANNED_KEYS: ClassVar[frozenset[str]] = frozenset()
    FOREIGN_KEYS: ClassVar[dict[str, str]] = {}  # a Determined key -> what to write instead


def _off_word(value: object) -> object:
    """YAML 1.1 reads a bare `off` as false: for a setting whose word is `off`, it is."""
    return "off" if value is False else value


# How a verification check judges what it finds: fail it (SUSPECT), warn, or not run.
CheckMode = Annotated[Literal["suspect", "warn", "off"], BeforeValidator(_off_word)]

_NO_CONTAINERS = ("muster runs the script in a Python environment, not in a container; name "
                  "what it needs in environment.pip or environment.requirements (muster "
                  "builds a venv for it), or run an existing one with environment.python")
MAX_REQUIREMENTS = 1000  # environment.pip entries
MAX_SETUP_COMMANDS = 100
MAX_SETUP_WORDS = 1000
_REQUIREMENT_CHARS = 1000


class EnvironmentConfig(_Section):
    """What every replica runs in: its Python environment (`muster.environments`) and extra
    environment variables on top of muster's own."""

    FOREIGN_KEYS: ClassVar[dict[str, str]] = {
        "image": _NO_CONTAINERS,
        "force_pull_image": _NO_CONTAINERS,
        "registry_auth": _NO_CONTAINERS,
        "add_capabilities": _NO_CONTAINERS,
        "drop_capabilities": _NO_CONTAINERS,
        "pod_spec": "Kubernetes pod specs are not supported: muster runs processes on its "
                    "hosts; use resources for what a trial needs",
        "environment_variables": "muster spells it environment.variables, a mapping "
                                 "(`variables: {OMP_NUM_THREADS: 1}`)",
        "proxy_ports": "muster opens no proxy ports; a replica listens where it likes",
    }

    variables: dict[str, str] = Field(default_factory=dict)
    # The interpreter (or a venv's) the trial runs on, or that a built venv is based on;
    # None: the one muster runs on.
    python: str | None = None
    pip: list[str] = Field(default_factory=list, max_length=MAX_REQUIREMENTS)
    requirements: str | None = None  # a requirements file inside the context
    # The built venv sees the base interpreter's packages; None: true (false only by choice).
    inherit: bool | None = None
    setup: list[list[str]] = Field(default_factory=list, max_length=MAX_SETUP_COMMANDS)
    # Names whose values never appear in the config or the API: `muster.job_secrets`.
    secrets: dict[str, str] = Field(default_factory=dict, max_length=MAX_SECRETS)

    @field_validator("secrets", mode="before")
    @classmethod
    def _names_are_submitted(cls, value: object) -> object:
        """`secrets: [A, B]` is `{A: submit, B: submit}`."""
        if isinstance(value, list):
            return {name: "submit" for name in value}
        return value

    @field_validator("secrets")
    @classmethod
    def _sources(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        problems = []
        for name, text in value.items():
            if not _ENV_NAME.fullmatch(name) or name.startswith(MUSTER_PREFIX):
                problems.append((name, "is not a usable environment variable name (letters, "
                                       "digits and '_', not starting with a digit or MUSTER_)"))
                continue
            if name in (info.data.get("variables") or {}):
                problems.append((name, "is also in environment.variables; keep it in one"))
            try:
                source_of(text)
            except ValueError as exc:
                problems.append((name, str(exc)))
        if problems:
            raise KeyedProblems(problems)
        return value

    @field_validator("python")
    @classmethod
    def _absolute_python(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "\x00" in value or not value.strip():
            raise ValueError("is not a path")
        if not (value.startswith("/") or value.startswith("~")):
            raise ValueError(f"{value!r} is not an absolute path; name the interpreter by its "
                             "full path, e.g. /opt/venvs/train/bin/python")
        return value

    @field_validator("pip")
    @classmethod
    def _requirement_lines(cls, value: list[str]) -> list[str]:
        problems = []
        for i, line in enumerate(value):
            if not line.strip() or any(c in line for c in "\r\n\x00"):
                problems.append((f"[{i}]", "is not one requirement (an empty string, or one "
                                           "with a line break)"))
            elif len(line) > _REQUIREMENT_CHARS:
                problems.append((f"[{i}]", f"is longer than {_REQUIREMENT_CHARS} characters"))
            elif line.lstrip().startswith("-"):
                problems.append((f"[{i}]", f"{line!r} is an option, not a requirement; put "
                                           "index options (--index-url, --find-links) in a "
                                           "requirements file (environment.requirements)"))
        if problems:
            raise KeyedProblems(problems)
        return value

    @field_validator("requirements")
    @classmethod
    def _relative_file(cls, value: str | None) -> str | None:
        if value is None:
            return None
        path = PurePosixPath(value)
        if not value.strip() or "\x00" in value or path.is_absolute() or ".." in path.parts:
            raise ValueError(f"{value!r} is not a path inside the context directory; name the "
                             "file relative to it, e.g. requirements.txt")
        return value

    @field_validator("setup")
    @classmethod
    def _argv_lists(cls, value: list[list[str]]) -> list[list[str]]:
        problems = []
        for i, argv in enumerate(value):
            if not argv or not argv[0].strip():
                problems.append((f"[{i}]", "is an empty command; give a program and its "
                                           "arguments, e.g. [python, -m, pip, install, x]"))
            elif len(argv) > MAX_SETUP_WORDS:
                problems.append((f"[{i}]", f"has more than {MAX_SETUP_WORDS} words"))
            elif any("\x00" in word for word in argv):
                problems.append((f"[{i}]", "holds a NUL character"))
        if problems:
            raise KeyedProblems(problems)
        return value

    @field_validator("setup", mode="before")
    @classmethod
    def _one_word_commands(cls, value: object) -> object:
        """A setup command is an argv list; a string is refused (no shell parses it)."""
        if isinstance(value, list):
            for i, argv in enumerate(value):
                if isinstance(argv, str):
                    raise KeyedProblems([(f"[{i}]", f"{argv!r} is a string, but setup commands "
                                                    "run without a shell; write it as a list "
                                                    f"of words, e.g. {argv.split()!r}")])
        return value

    def builds(self) -> bool:
        """Whether muster builds a venv for this environment (else the trial runs on the
        base interpreter, under a layer of its own)."""
        return bool(self.pip or self.requirements or self.setup or self.inherit is False)

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
    # OOM (the kernel's OOM killer, the memory watchdog, MemoryError, CUDA out of memory):
    # a retry runs out of memory the same way, unless the data or the machine differ.
    oom_retries: int = Field(default=0, ge=0)
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
    # A replica that wrote no output AND whose process group used no CPU for this long is
    # STALLED, harness or not (a download prints nothing but uses CPU; a deadlock neither).
    # None: `off`.
    silence_timeout: float | None = Field(default=1800.0, gt=0)
    # With `launcher: ray`: how long an attempt's placement group may wait for the cluster
    # to have room (CAPACITY), and how many such waits a trial gets before it fails.
    capacity_timeout: float = Field(default=600.0, gt=0)
    capacity_retries: int = Field(default=3, ge=0)

    @field_validator("stop_grace", "failure_grace", "heartbeat_timeout", "capacity_timeout",
                     mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)

    @field_validator("silence_timeout", mode="before")
    @classmethod
    def _duration_or_off(cls, value: object) -> float | None:
        if value is None or value is False or (isinstance(value, str)
                                               and value.strip().lower() == "off"):
            return None
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

    FOREIGN_KEYS: ClassVar[dict[str, str]] = {
        key: "muster's data block names the directory it scans before launch (data.path); "
             "values for the script, Determined's free-form `data`, go under hyperparameters"
        for key in ("url", "urls", "bucket", "dir", "directory", "pachyderm", "worker")}

    path: str = Field(min_length=1)
    manifest: ManifestConfig = Field(default_factory=ManifestConfig)
    # A data path whose manifest counts no file is refused (at submission, else before the
    # launch): a run over no data verifies nothing. True: the script brings its own data.
    allow_empty: bool = False


MAX_REPLICAS = 64
MIN_MEMORY_LIMIT = 1 << 20
MIN_LOG_LIMIT = 1 << 20  # the least a shim holds a log to (muster.launch.log_limit)


MAX_GPUS_PER_REPLICA = 64


class ResourcesConfig(_Section):
    """What each trial runs on: how many replicas (ranks) start and stop together, how much
    memory each replica's processes may use together (bytes; None: no limit), how many GPUs
    each replica gets (of which type), the experiment's cap on replicas running at once,
    its place in the queue (priority 1-99, lower runs first, as in Determined), when its
    replicas get torchrun's variables (`distributed_env`), and how much of its output each
    replica's log keeps on disk (`log_limit`: None, the cluster config's; `off`, all of it)."""

    FOREIGN_KEYS: ClassVar[dict[str, str]] = {
        "slots_per_trial": "muster asks for processes and GPUs apart: use resources.replicas "
                           "(processes, one per GPU as Determined starts them) and "
                           "resources.gpus_per_replica",
        "resource_pool": "this server is the one pool; remove it (resources.gpu_type picks "
                         "the GPUs)",
        "shm_size": _NO_CONTAINERS,
        "devices": _NO_CONTAINERS,
        "agent_label": "this server is the one pool; remove it",
        "weight": "muster orders the queue by resources.priority (1-99, lower first)",
        "native_parallel": "remove it: every replica is a process muster starts",
        "is_single_node": "remove it: a trial's replicas run on one host",
    }

    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    memory_limit: int | None = None
    gpus_per_replica: int = Field(default=0, ge=0, le=MAX_GPUS_PER_REPLICA)
    gpu_type: str | None = Field(default=None, min_length=1)
    max_slots: int | None = Field(default=None, ge=1)
    priority: int = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    # When replicas get torchrun's variables (`launch.torchrun.wants_distributed_env`);
    # not strict: YAML gives the word, the enum's member is what the code compares.
    distributed_env: DistributedEnv = Field(default=DistributedEnv.AUTO, strict=False)
    # Past it a replica's log keeps its head and its latest output (docs/run-directory.md).
    log_limit: int | Literal["off"] | None = None

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

    @field_validator("log_limit", mode="before")
    @classmethod
    def _log_limit(cls, value: object) -> int | Literal["off"] | None:
        """`10GiB`, a number of bytes, or `off` (the whole output is kept)."""
        if value is None:
            return None
        size = log_limit_or_off(value)
        return "off" if size is None else size

    def log_limit_bytes(self, cluster_default: int | None) -> int | None:
        """The limit a replica's log is held to: this config's, else the cluster's default;
        None: no limit."""
        if self.log_limit is None:
            return cluster_default
        return None if self.log_limit == "off" else self.log_limit


def log_limit_or_off(value: object) -> int | None:
    """A `log_limit` as written: a size of at least 1MiB, or `off` (None).

    Raises:
        ValueError: it is neither.
    """
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    try:
        size = parse_size(value)
    except ValueError:
        raise ValueError(f"must be a size such as '10GiB', or 'off' to keep all output, got "
                         f"{value!r}") from None
    if size < MIN_LOG_LIMIT:
        raise ValueError(f"must be at least 1MiB (write a unit, e.g. '10GiB'), got {value!r}")
    return size


MAX_OUTPUTS = 100
MAX_PATTERN_CHARS = 1000
MAX_LOG_METRIC_PATTERNS = 20  # verify.metrics_from_log's named regexes


class ExpectedLength(_Section):
    """How far a run is planned to train, in one unit (`verify.expected_length`): the
    `completed` check needs its last reported progress to reach it."""

    steps: int | None = Field(default=None, ge=1)
    epochs: int | None = Field(default=None, ge=1)
    batches: int | None = Field(default=None, ge=1)
    records: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_unit(self) -> ExpectedLength:
        if len(self.given()) != 1:
            raise ValueError("must name exactly one unit: steps, epochs, batches or records "
                             "(e.g. expected_length: {epochs: 10})")
        return self

    def given(self) -> list[tuple[str, int]]:
        return [(unit, n) for unit in ("steps", "epochs", "batches", "records")
                if (n := getattr(self, unit)) is not None]

    @property
    def unit(self) -> str:
        return self.given()[0][0]

    @property
    def length(self) -> int:
        return self.given()[0][1]


class VerifyConfig(_Section):
    """The checks that must pass before an exit 0 counts as SUCCEEDED (else SUSPECT)."""

    samples_tolerance: float = Field(default=0.01, ge=0, le=1)
    expected_samples: int | None = Field(default=None, ge=1)
    require_checkpoint: bool | None = None  # None: required when the harness was used
    # Ranks of one attempt that loaded different libraries or ran with other numerics
    # switches or variables: SUSPECT (default), a warning in the check, or not checked.
    consistent_ranks: CheckMode = "suspect"
    finite_metrics: bool = True
    require_metrics: list[str] = Field(default_factory=list)
    # For scripts without the harness: a regex over the rank logs with a named group
    # `samples` (and optionally `epoch`), compared with the data manifest like ctx.samples.
    samples_from_log: str | None = Field(default=None, min_length=1,
                                         max_length=MAX_PATTERN_CHARS)
    # Files (relative to the trial's working directory) the run must write, not empty.
    outputs: list[str] = Field(default_factory=list, max_length=MAX_OUTPUTS)
    # How far the run is planned to go; else the searcher's max_length or the harness's
    # ctx.plan() say it, and without any the `completed` check does not run.
    expected_length: ExpectedLength | None = None
    # A traceback, KeyboardInterrupt or CUDA/NCCL error in a log after the last progress.
    log_errors: CheckMode = "suspect"
    # Metrics read from the rank logs (`muster.supervise.log_metrics`): metric name → regex
    # with a named group `value` (and optionally `step` or `epoch`), stored as the trial's.
    metrics_from_log: dict[str, str] = Field(default_factory=dict,
                                             max_length=MAX_LOG_METRIC_PATTERNS)
    # The built-in recognisers (Hugging Face's dicts, Lightning's bars, `loss: 0.12`):
    # `auto` reads the logs of a script without `harness: true` that wrote no metrics file.
    log_metrics: Annotated[Literal["auto", "off"], BeforeValidator(_off_word)] = "auto"

    @field_validator("require_metrics")
    @classmethod
    def _metric_names(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if _submitted(info):
            problems = [(f"[{i}]", problem) for i, name in enumerate(value)
                        if (problem := name_problem(name)) is not None]
            if problems:
                raise KeyedProblems(problems)
        return value

    @field_validator("samples_from_log")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"is not a regular expression: {exc}") from None
        if "samples" not in compiled.groupindex:
            raise ValueError("needs a named group `samples`, e.g. "
                             "'epoch (?P<epoch>\\d+) .* samples=(?P<samples>\\d+)'")
        return value

    @field_validator("metrics_from_log")
    @classmethod
    def _log_patterns(cls, value: dict[str, str]) -> dict[str, str]:
        problems = [(name, problem) for name, pattern in value.items()
                    if (problem := _log_metric_problem(name, pattern)) is not None]
        if problems:
            raise KeyedProblems(problems)
        return value

    @field_validator("outputs")
    @classmethod
    def _relative_paths(cls, value: list[str]) -> list[str]:
        for path in value:
            parts = PurePosixPath(path).parts
            if not path or path.startswith("/") or ".." in parts or "\x00" in path:
                raise ValueError(f"{path!r} must be a path inside the trial's working "
                                 "directory (relative, without ..)")
        return value


def _log_metric_problem(name: str, pattern: str) -> str | None:
    """Why `pattern` cannot read the metric `name` from a log, or None."""
    problem = name_problem(name)
    if problem is not None:
        return f"{problem} (the key is the metric's name)"
    if not pattern or len(pattern) > MAX_PATTERN_CHARS:
        return f"must be a regular expression of 1 to {MAX_PATTERN_CHARS} characters"
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"is not a regular expression: {exc}"
    if "value" not in compiled.groupindex:
        return ("needs a named group `value`, e.g. 'val acc (?P<value>[0-9.]+)' (and "
                "optionally `step` or `epoch`: '(?P<step>\\d+)')")
    return None


LENGTH_UNITS = ("batches", "epochs", "records")
SEARCHERS = ("single", "grid", "random", "tpe", "asha", "adaptive_asha", "bohb", "nsga2", "pbt")
# Those that can search several objectives at once (`searcher.metrics`): the samplers that
# compare trials by Pareto dominance; a pruner judges one metric, so no pruning searcher.
MULTI_OBJECTIVE_SEARCHERS = ("grid", "random", "tpe", "nsga2")
MAX_OBJECTIVES = 4
PRUNING_SEARCHERS = frozenset({"asha", "adaptive_asha", "bohb"})  # they stop trials early
MAX_TRIALS = 10_000
# The keys of a warm start (`SearcherConfig.warm_start`): each names the checkpoint the
# trials start from, at most one is set.
SOURCE_KEYS = ("source_trial_id", "source_checkpoint_uuid", "source_model")
SOURCE_CHECKPOINTS = ("latest", "best")  # `source_checkpoint`
MAX_ID = 2**31 - 1  # the largest id the store holds (an INTEGER column)
# Settings that only some searchers read: which, so that a setting a searcher would ignore
# is an error rather than a silent no-op.
_ONLY_FOR = {
    "mode": ("adaptive_asha", "bohb"),
    "divisor": ("asha", "adaptive_asha", "bohb"),
    "max_rungs": ("asha", "adaptive_asha", "bohb"),
    "population_size": ("pbt",),
    "num_rounds": ("pbt",),
    "length_per_round": ("pbt",),
    "replace_function": ("pbt",),
    "explore_function": ("pbt",),
}
MAX_POPULATION = 1000  # searcher.population_size (pbt)


def _validation_metric(value: str, info: ValidationInfo) -> str:
    """A validation metric's name as a submitted config gives it, checked (`NAME_RULE`)."""
    problem = name_problem(value) if _submitted(info) else None
    if problem is not None:
        raise ValueError(f"{problem}; name the validation metric as the script reports it")
    return value


class Objective(_Section):
    """One objective of a multi-objective search (`searcher.metrics`)."""

    name: str = Field(min_length=1)  # a validation metric the script reports
    smaller_is_better: bool = True

    @field_validator("name")
    @classmethod
    def _metric_name(cls, value: str, info: ValidationInfo) -> str:
        return _validation_metric(value, info)


class ReplaceFunction(_Section):
    """Which members of a PBT generation are replaced (Determined's `replace_function`):
    the worst `truncate_fraction` of the population, by the searcher's metric, continue from
    a copy of one of the best as many instead of from their own checkpoint."""

    truncate_fraction: float = Field(default=0.25, ge=0.0, le=0.5)


class ExploreFunction(_Section):
    """How a replaced member's hyperparameters are changed from its parent's (Determined's
    `explore_function`): each searched one is drawn again with `resample_probability`,
    else multiplied by 1 - `perturb_factor` or 1 + `perturb_factor` (a categorical one moves
    to a neighbouring value), within its range. `hyperparameters` (Ray Tune's
    `hyperparam_mutations`) limits it to those named: one that shapes the model (a layer's
    width) cannot change while the weights go on; the others stay as the parent's."""

    resample_probability: float = Field(default=0.2, ge=0.0, le=1.0)
    perturb_factor: float = Field(default=0.2, gt=0.0, lt=1.0)
    hyperparameters: list[Annotated[str, Field(min_length=1, max_length=500)]] | None = Field(
        default=None, min_length=1, max_length=1000)


class SearcherConfig(_Section):
    """How the experiment's trials are chosen (Determined's `searcher` block): `single` runs
    one trial; the others sample `hyperparameters` (Optuna samplers and pruners).

    `max_length` is in the units of report_validation's steps; Determined's
    `max_length: {batches: N}` (or `epochs`, `records`) is accepted, the unit kept in
    `max_length_unit` and shown with it. With `time_metric` (Determined's), `max_length` and
    the rungs count that validation metric's value instead of the steps: a script that
    reports `epochs: 3` with its validation has trained 3 of `max_length: 20`."""

    FOREIGN_KEYS: ClassVar[dict[str, str]] = {
        "bracket_rungs": "muster's asha places rungs by divisor and max_rungs",
        "stop_once": "muster's asha stops a trial once, at the rung it falls behind",
        "max_time": "muster spells it searcher.max_length (counted in time_metric's "
                    "values when time_metric is set)",
    }

    name: Literal["single", "grid", "random", "tpe", "asha", "adaptive_asha", "bohb",
                  "nsga2", "pbt"] = "single"
    metric: str | None = Field(default=None, min_length=1)
    smaller_is_better: bool = True
    # Several objectives at once (multi-objective search): the first is also `metric` and
    # `smaller_is_better` (what lists sort by, the "best" of one metric); the search keeps the
    # trials no other beats on every objective (the Pareto front).
    metrics: list[Objective] | None = Field(default=None, min_length=2,
                                            max_length=MAX_OBJECTIVES)
    max_trials: int | None = Field(default=None, ge=1, le=MAX_TRIALS)
    max_concurrent_trials: int = Field(default=16, ge=1)
    max_length: int | None = Field(default=None, ge=1)  # in report_validation's step units
    max_length_unit: Literal["steps", "batches", "epochs", "records"] = "steps"
    # A validation metric whose value counts progress (Determined's time_metric): when set,
    # max_length and the rungs are in its values, not in report_validation's steps.
    time_metric: str | None = Field(default=None, min_length=1)
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    divisor: int = Field(default=4, ge=2, le=100)
    max_rungs: int = Field(default=5, ge=1, le=20)
    # A warm start: the checkpoint each trial starts from while it has none of its own, named
    # by one of these (Determined's first two), resolved to one checkpoint when the
    # experiment is submitted (`muster.services.warm_starts`).
    source_trial_id: int | None = Field(default=None, ge=1, le=MAX_ID)  # its latest
    source_checkpoint_uuid: str | None = Field(default=None, min_length=1, max_length=64)
    source_model: str | None = Field(default=None, min_length=1, max_length=200)  # NAME@V
    # Which of source_trial_id's checkpoints: "latest" (Determined's, the default) or "best"
    # by the searcher metric of the source trial's experiment.
    source_checkpoint: str | None = None
    # Population-based training (`pbt`, `muster.search.pbt`): `num_rounds` generations of
    # `population_size` trials, each trained `length_per_round` further than its parent.
    population_size: int | None = Field(default=None, ge=2, le=MAX_POPULATION)
    num_rounds: int | None = Field(default=None, ge=1, le=MAX_TRIALS)
    length_per_round: int | None = Field(default=None, ge=1)  # in max_length's units
    replace_function: ReplaceFunction = Field(default_factory=ReplaceFunction)
    explore_function: ExploreFunction = Field(default_factory=ExploreFunction)

    def length_of(self, generation: int | None) -> int | None:
        """How far a trial trains in all (its planned length, MUSTER_MAX_LENGTH):
        `max_length`, or for a trial of PBT generation g, (g + 1) * `length_per_round`
        (it continues from its parent's checkpoint at g * `length_per_round`)."""
        if self.name != "pbt" or generation is None or self.length_per_round is None:
            return self.max_length
        return (generation + 1) * self.length_per_round

    def prunes(self) -> bool:
        """Whether this searcher stops poor trials early (its pruner judges validation)."""
        return self.name in PRUNING_SEARCHERS

    @field_validator("metric", "time_metric")
    @classmethod
    def _metric_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _validation_metric(value, info)

    def objectives(self) -> list[Objective]:
        """What the search compares trials by: `metrics`, or `metric` alone (empty when it
        compares none)."""
        if self.metrics is not None:
            return list(self.metrics)
        return [] if self.metric is None else [Objective(name=self.metric,
                                                         smaller_is_better=self.smaller_is_better)]

    def multi_objective(self) -> bool:
        return self.metrics is not None

    @model_validator(mode="before")
    @classmethod
    def _first_objective_is_the_metric(cls, data: object) -> object:
        """`metrics: [{name: a, ...}, ...]` without `metric`: `metric` (and its direction)
        is the first objective."""
        if not isinstance(data, Mapping) or not isinstance(data.get("metrics"), list):
            return data
        first = data["metrics"][0] if data["metrics"] else None
        if not isinstance(first, Mapping) or "metric" in data:
            return data
        return {**data, "metric": first.get("name"),
                "smaller_is_better": first.get("smaller_is_better", True)}

    @field_validator("source_checkpoint")
    @classmethod
    def _latest_or_best(cls, value: str | None) -> str | None:
        if value is not None and value not in SOURCE_CHECKPOINTS:
            raise ValueError(f"chooses source_trial_id's checkpoint: latest or best, not "
                             f"{value!r} (a checkpoint named by its uuid is "
                             "source_checkpoint_uuid)")
        return value

    def warm_start(self) -> tuple[str, str] | None:
        """The key that names the checkpoint to start from, and its value as written;
        None without a warm start."""
        for key in SOURCE_KEYS:
            value = getattr(self, key)
            if value is not None:
                return key, str(value)
        return None

    @model_validator(mode="before")
    @classmethod
    def _length_with_a_unit(cls, data: object) -> object:
        """Determined's `max_length: {batches: 100}` -> max_length 100, unit "batches"
        (and `length_per_round: {batches: 100}` the same way)."""
        if not isinstance(data, Mapping):
            return data
        for key in ("max_length", "length_per_round"):
            if not isinstance(data.get(key), Mapping):
                continue
            length = dict(data[key])
            if len(length) != 1 or next(iter(length)) not in LENGTH_UNITS:
                raise KeyedProblems([(key, "must be a number of steps, or one unit and its "
                                      "count: {batches: N}, {epochs: N} or {records: N}")])
            [(unit, value)] = length.items()
            if "max_length_unit" in data and data["max_length_unit"] != unit:
                raise KeyedProblems([("max_length_unit", f"says {data['max_length_unit']!r}, "
                                      f"but {key} is in {unit}; keep one")])
            data = {**data, key: value, "max_length_unit": unit}
        return data

    @model_validator(mode="after")
    def _complete(self) -> SearcherConfig:
        problems = _searcher_problems(self)
        if problems:
            raise KeyedProblems(problems)
        return self


def _objective_problems(config: SearcherConfig) -> list[tuple[str, str]]:
    """What is wrong with `metrics` (several objectives) for this searcher."""
    if config.metrics is None:
        return []
    names = [objective.name for objective in config.metrics]
    problems = []
    if len(set(names)) < len(names):
        problems.append(("metrics", f"names an objective twice ({', '.join(names)}); each "
                                    "metric once"))
    if config.name not in MULTI_OBJECTIVE_SEARCHERS:
        why = ("it ranks each generation by one" if config.name == "pbt"
               else "a pruner judges one")
        problems.append(("metrics", f"the {config.name} searcher compares trials by one metric "
                                    f"({why}); search several objectives with "
                                    f"{', '.join(MULTI_OBJECTIVE_SEARCHERS[:-1])} or "
                                    f"{MULTI_OBJECTIVE_SEARCHERS[-1]}, or keep one metric"))
    first = config.metrics[0]
    if (config.metric, config.smaller_is_better) != (first.name, first.smaller_is_better):
        problems.append(("metric", f"with searcher.metrics the first objective "
                                   f"({first.name}) is the metric; remove metric and "
                                   "smaller_is_better, or make them the first objective's"))
    return problems


def _searcher_problems(config: SearcherConfig) -> list[tuple[str, str]]:
    name = config.name
    # A stored config holds every default, so only a value other than the default is one
    # the person set for a searcher that ignores it.
    problems = [(key, f"only the {' and '.join(searchers)} searcher"
                      + (" uses" if len(searchers) == 1 else "s use")
                      + f" it, not {name}; remove it")
                for key, searchers in _ONLY_FOR.items()
                if name not in searchers
                and getattr(config, key) != SearcherConfig.model_fields[key].get_default(
                    call_default_factory=True)]
    problems += _objective_problems(config)
    if name != "single" and config.metric is None:
        problems.append(("metric", f"required by the {name} searcher, which compares trials by "
                                   "a validation metric: name one the script reports with "
                                   "report_validation, e.g. `metric: val_loss`"))
    if name == "single" and config.max_trials not in (None, 1):
        problems.append(("max_trials", "the single searcher runs one trial; choose random, "
                                       "tpe, nsga2, asha, adaptive_asha, bohb or pbt to run more"))
    if name == "grid" and config.max_trials is not None:
        problems.append(("max_trials", "a grid runs one trial per point (the product of the "
                                       "counts); remove max_trials"))
    problems += _pbt_problems(config)
    if name in ("random", "tpe", "nsga2", *PRUNING_SEARCHERS) and config.max_trials is None:
        problems.append(("max_trials", f"required by the {name} searcher: how many trials to "
                                       "run in all"))
    if name in PRUNING_SEARCHERS and config.max_length is None:
        problems.append(("max_length", f"required by {name}, whose rungs are fractions of it "
                                       "(in the steps the script reports validation with)"))
    if config.time_metric is not None and config.max_length is None and name != "pbt":
        problems.append(("time_metric", "counts max_length in that metric's values: set "
                                        "searcher.max_length too"))
    named = [key for key in SOURCE_KEYS if getattr(config, key) is not None]
    if len(named) > 1:
        problems.append((named[-1], f"{' and '.join(named)} each name the checkpoint the "
                                    "trials start from; keep one"))
    if config.source_checkpoint is not None and config.source_trial_id is None:
        problems.append(("source_checkpoint", "chooses source_trial_id's checkpoint (latest "
                                              "or best): set source_trial_id, or remove it"))
    if config.time_metric is not None and config.max_length_unit != "steps":
        problems.append(("max_length_unit", f"max_length is counted in time_metric "
                                            f"{config.time_metric!r}'s values, not in "
                                            f"{config.max_length_unit}; remove one of them"))
    return problems


def _pbt_problems(config: SearcherConfig) -> list[tuple[str, str]]:
    """What PBT needs: a population, its rounds and their length, and no other count."""
    if config.name != "pbt":
        return []
    problems = [(key, f"required by the pbt searcher: {why}") for key, why in (
        ("population_size", "how many trials train side by side in each round"),
        ("num_rounds", "how many rounds (generations) the population trains"),
        ("length_per_round", "how far each round trains, in the steps the script reports "
                             "validation with (or {batches: N}, {epochs: N})"))
        if getattr(config, key) is None]
    if config.max_trials is not None:
        problems.append(("max_trials", "pbt runs population_size * num_rounds trials (one "
                                       "per member and round); remove max_trials"))
    if config.max_length is not None:
        problems.append(("max_length", "pbt trains each round length_per_round further "
                                       "(num_rounds * length_per_round in all); remove "
                                       "max_length"))
    if (config.population_size is not None and config.num_rounds is not None
            and config.population_size * config.num_rounds > MAX_TRIALS):
        problems.append(("num_rounds", f"population_size * num_rounds is "
                                       f"{config.population_size * config.num_rounds:,} "
                                       f"trials, over the {MAX_TRIALS:,} a search may run"))
    return problems


MAX_KEPT = 1000  # a checkpoint_storage.save_* count
_SECRET_REFERENCE = ("write where the server reads it: `env:NAME` (its environment) or "
                     "`file:/absolute/path` (a file on the server); a key written here would "
                     "be stored and shown with the config")


class CheckpointStorageConfig(_Section):
    """Where checkpoints are stored and how many are kept (Determined's names).

    Without `type`, only the `save_*` counts are set here and the storage is the server's
    default (the cluster config's `checkpoint_storage`, else shared_fs in
    `$MUSTER_HOME/checkpoints`). S3 keys are never written in a config: `access_key` and
    `secret_key` name where the server reads them (`env:NAME`, `file:/path`); without
    them boto3's default credential chain is used.
    """

    FOREIGN_KEYS: ClassVar[dict[str, str]] = {
        "host_path": "muster spells it path (an absolute directory on the server, shared "
                     "by every machine that runs trials)",
        "storage_path": "give the whole directory as path (host_path and storage_path "
                        "joined)",
        "propagation": "remove it: muster mounts nothing",
        "container_path": "remove it: muster runs no containers",
        "checkpoint_path": "remove it: checkpoints go under path",
        "tensorboard_path": "remove it: muster keeps no TensorBoard files",
    }

    type: Literal["shared_fs", "s3"] | None = None
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    bucket: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = Field(default="", max_length=512)
    endpoint_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/.*)?$",
                                     max_length=2048)
    region: str | None = Field(default=None, pattern=r"^[a-z0-9-]{1,64}$")
    access_key: str | None = None
    secret_key: str | None = None
    save_trial_latest: int | None = Field(default=None, ge=0, le=MAX_KEPT)
    save_trial_best: int | None = Field(default=None, ge=0, le=MAX_KEPT)
    save_experiment_best: int | None = Field(default=None, ge=0, le=MAX_KEPT)

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not PurePosixPath(value).is_absolute():
            raise ValueError(f"must be an absolute directory on the server, got {value!r}")
        return value

    @field_validator("prefix")
    @classmethod
    def _normal_prefix(cls, value: str) -> str:
        parts = [p for p in value.split("/") if p not in ("", ".")]
        if ".." in parts or "\0" in value:
            raise ValueError(f"must not contain '..' or NUL, got {value!r}")
        return "/".join(parts)

    @field_validator("access_key", "secret_key")
    @classmethod
    def _reference(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            source = source_of(value)
        except ValueError:
            source = None
        if source is None or source.kind == "submit":
            raise ValueError(_SECRET_REFERENCE)
        return value

    @model_validator(mode="after")
    def _fits_its_type(self) -> CheckpointStorageConfig:
        s3_keys = [k for k in ("bucket", "endpoint_url", "region", "access_key", "secret_key")
                   if getattr(self, k) is not None] + (["prefix"] if self.prefix else [])
        problems: list[tuple[str, str]] = []
        if self.type is None and (s3_keys or self.path is not None):
            first = s3_keys[0] if s3_keys else "path"
            problems.append((first, "says where checkpoints go, so `type` (shared_fs or s3) "
                                    "must be set too"))
        if self.type == "shared_fs":
            problems += [(k, "is an s3 setting; shared_fs takes path") for k in s3_keys]
        if self.type == "s3":
            if self.path is not None:
                problems.append(("path", "is a shared_fs setting; s3 takes bucket and prefix"))
            if self.bucket is None:
                problems.append(("bucket", "is required by type: s3"))
            if (self.access_key is None) != (self.secret_key is None):
                problems.append(("secret_key" if self.secret_key is None else "access_key",
                                 "access_key and secret_key go together: give both, or "
                                 "neither (boto3's default credentials)"))
        if problems:
            raise KeyedProblems(problems)
        return self


class ReproducibilityConfig(_Section):
    """`experiment_seed` seeds the searcher (the same seed draws the same hyperparameters)
    and each trial (MUSTER_SEED). `deterministic` asks every rank for deterministic
    numerics: PYTHONHASHSEED=0 and CUBLAS_WORKSPACE_CONFIG=:4096:8 in its environment, and
    the harness seeds Python, NumPy and torch from MUSTER_SEED and turns on torch's
    deterministic algorithms (`muster.harness.determinism`)."""

    experiment_seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    deterministic: bool = False

    @model_validator(mode="after")
    def _seeded(self) -> ReproducibilityConfig:
        if self.deterministic and self.experiment_seed is None:
            raise KeyedProblems([("experiment_seed", "required by deterministic: true, which "
                                  "seeds every rank's generators from it; e.g. "
                                  "experiment_seed: 1234")])
        return self




class DiagnosticsConfig(_Section):
    """The coded-bias diagnostics of `muster.harness.torch` (docs/diagnostics.md): what each
    rank records, and how each check judges the ranks together. A check set to `suspect`
    ends an exit 0 SUSPECT when it finds something, `warn` only says so in its detail, and
    `off` does not run."""

    record: bool = True  # false: the harness records nothing (MUSTER_DIAGNOSTICS=off)
    interval: int = Field(default=20, ge=1, le=1_000_000)  # optimizer steps between samples
    sampler_overlap: CheckMode = "suspect"
    rank_seeds: CheckMode = "suspect"
    grad_norm_spread: CheckMode = "suspect"
    replica_hash: CheckMode = "suspect"
    finite_all_ranks: CheckMode = "suspect"
    sample_balance: CheckMode = "warn"
    epoch_order: CheckMode = "warn"
    # The share of the same samples two ranks may draw in one pass.
    overlap_bound: float = Field(default=0.5, gt=0, le=1)
    # The std of the ranks' local gradient norms over their mean, as a running median of
    # 5 samples, and the largest ratio of two ranks' norms in any one sample.
    spread_bound: float = Field(default=0.5, gt=0)
    ratio_bound: float = Field(default=20.0, gt=1)
    # The most samples one rank may draw in a pass, as a multiple of the fewest.
    imbalance_bound: float = Field(default=1.2, gt=1)


class DebugConfig(_Section):
    """`torch_distributed: detail` sets TORCH_DISTRIBUTED_DEBUG=DETAIL for every rank: torch
    then checks that the ranks' collectives match. Never on by default: it hung DDP on
    gloo and crashed under Ray in trials here."""

    torch_distributed: Annotated[Literal["off", "detail"], BeforeValidator(_off_word)] = "off"


MAX_ARTIFACT_PATTERNS = 100
MAX_ARTIFACT_PATTERN_CHARS = 1024
DEFAULT_ARTIFACTS_LIMIT = 10 << 30


def _artifact_pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot name files of the working directory, or None."""
    parts = PurePosixPath(pattern).parts
    if not pattern or len(pattern) > MAX_ARTIFACT_PATTERN_CHARS:
        return f"must be a pattern of 1 to {MAX_ARTIFACT_PATTERN_CHARS} characters"
    if pattern.startswith("/") or ".." in parts or "\x00" in pattern:
        return (f"{pattern!r} must name files inside the trial's working directory "
                "(relative, without ..), e.g. 'model.pt', 'eval/*.json', 'plots/'")
    return None


class ExperimentConfig(_Section):
    """One experiment: what to run, in which environment, and how to handle failures."""

    FOREIGN_KEYS: ClassVar[dict[str, str]] = {
        "bind_mounts": "muster runs on the host, so host paths need no mount: point data.path "
                       "(or an argument) at them; the context is copied for each trial",
        "max_restarts": "muster spells it failure_policy.trial_retries (and counts kinds of "
                        "failure apart: see failure_policy)",
        "records_per_epoch": "muster counts the data set itself (data.path); to give the "
                             "count instead, set verify.expected_samples",
        "min_validation_period": "the script decides when to validate "
                                 "(muster.harness report_validation); remove it",
        "min_checkpoint_period": "the script decides when to checkpoint "
                                 "(muster.harness.torch.save); remove it",
        "scheduling_unit": "remove it: the script reports metrics when it likes",
        "perform_initial_validation": "remove it: the script validates when it likes",
        "checkpoint_policy": "remove it: muster keeps the checkpoints the script saves (and "
                             "garbage-collects them by checkpoint_storage.save_*)",
        "profiling": "remove it: muster does not profile (run the profiler in the script)",
        "optimizations": "remove it: the script sets up its own distributed training",
        "workspace": "muster has no workspaces yet; remove it",
        "project": "muster has no projects yet; use labels",
        "slurm": "muster does not submit to Slurm; remove it",
        "pbs": "muster does not submit to PBS; remove it",
    }

    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    labels: list[str] = Field(default_factory=list)
    entrypoint: list[str] = Field(min_length=1)
    # The entrypoint calls muster.harness.init() on every rank. muster cannot know that
    # before the script runs; said here, RUNNING waits for every rank's check-in, a rank
    # that never checks in is STALLED, and verification expects what the harness records.
    harness: bool = False
    # `auto`: a script that trains with Lightning or the Hugging Face Trainer gets muster's
    # callback through an import hook, without a line changed (`muster.integrations`);
    # `off`: it runs as written. Unset: auto, unless `harness: true` (the script connects
    # itself). `integrations_active` says which.
    integrations: Annotated[Literal["auto", "off"], BeforeValidator(_off_word)] | None = None
    # `determined`: the trial imports muster's Determined Core API (`muster.compat`) as
    # `determined`; set for a config translated from Determined's (`muster.config.determined`).
    compat: Literal["determined"] | None = None
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    data: DataConfig | None = None
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    # Mappings, `{type: ...}` ranges and constants; `muster.config.space` says what each is.
    hyperparameters: WrittenSpace = Field(default_factory=dict)
    searcher: SearcherConfig = Field(default_factory=SearcherConfig)
    reproducibility: ReproducibilityConfig = Field(default_factory=ReproducibilityConfig)
    checkpoint_storage: CheckpointStorageConfig = Field(default_factory=CheckpointStorageConfig)
    # Files of the working directory (globs: `model.pt`, `eval/*.json`, `plots/`) the final
    # attempt's end copies into the trial's storage (`muster.artifacts`), with
    # verify.outputs; at most `artifacts_limit` bytes of them.
    artifacts: list[str] = Field(default_factory=list, max_length=MAX_ARTIFACT_PATTERNS)
    artifacts_limit: int = DEFAULT_ARTIFACTS_LIMIT
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    debug: DebugConfig = Field(default_factory=DebugConfig)

    @property
    def integrations_active(self) -> bool:
        """Whether trials get the frameworks' import hook (`integrations`)."""
        return self.integrations == "auto" or (self.integrations is None and not self.harness)

    @property
    def artifact_patterns(self) -> list[str]:
        """What the final attempt's end copies: `artifacts`, then `verify.outputs`."""
        return list(dict.fromkeys([*self.artifacts, *self.verify.outputs]))

    @field_validator("artifacts")
    @classmethod
    def _artifact_patterns(cls, value: list[str]) -> list[str]:
        problems = [(f"[{i}]", problem) for i, pattern in enumerate(value)
                    if (problem := _artifact_pattern_problem(pattern)) is not None]
        if problems:
            raise KeyedProblems(problems)
        return value

    @field_validator("artifacts_limit", mode="before")
    @classmethod
    def _artifacts_limit(cls, value: object) -> int:
        """`10GiB`, `500MiB` or a number of bytes."""
        try:
            size = parse_size(value)
        except ValueError:
            raise ValueError(f"must be a size such as '10GiB', got {value!r}") from None
        if size < 1 << 10:
            raise ValueError(f"must be at least 1KiB (write a unit, e.g. '10GiB'), got "
                             f"{value!r}")
        return size

    @field_validator("debug", mode="before")
    @classmethod
    def _determined_debug(cls, value: object) -> object:
        if isinstance(value, bool):
            raise ValueError("muster's logs always carry every line, so Determined's "
                             "`debug: true` has no use here; `debug` takes "
                             "{torch_distributed: detail} (TORCH_DISTRIBUTED_DEBUG=DETAIL)")
        return value

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _argv(cls, value: object) -> object:
        """A string is split like a shell would split it, but never run by a shell."""
        words = [value] if isinstance(value, str) else value
        if (isinstance(words, list) and len(words) == 1 and isinstance(words[0], str)
                and _TRIAL_CLASS.fullmatch(words[0])):
            raise ValueError(f"{words[0]!r} names a Determined Trial class, and Trial classes "
                             "are not supported; run a script (e.g. `entrypoint: python "
                             "train.py`) that calls muster.harness")
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
    def _space(cls, value: WrittenSpace, info: ValidationInfo) -> WrittenSpace:
        names = list(space.parse(value).params)  # raises SpaceProblems, each with its key path
        if _submitted(info):
            problems = [(name, problem) for name in names
                        if (problem := name_problem(name, "hyperparameter")) is not None]
            if problems:
                raise KeyedProblems(problems)
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
        problems = parsed.grid_problems(MAX_TRIALS) if searcher.name == "grid" else []
        explored = searcher.explore_function.hyperparameters or []
        problems += [("searcher.explore_function.hyperparameters",
                      f"names {name!r}, which is not a searched hyperparameter (searched: "
                      f"{', '.join(searched) or 'none'}); name the key paths to explore")
                     for name in explored if name not in searched]
        if problems:
            raise KeyedProblems([(path if path.startswith("searcher.")
                                  else f"hyperparameters.{path}", problem)
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
        if self.searcher.name == "pbt":
            assert self.searcher.population_size and self.searcher.num_rounds, "checked"
            return self.searcher.population_size * self.searcher.num_rounds
        assert self.searcher.max_trials is not None, "checked by SearcherConfig"
        return self.searcher.max_trials

    @model_validator(mode="after")
    def _log_samples_have_a_count(self) -> ExperimentConfig:
        """Samples counted from the log are compared with something: the data manifest or
        `verify.expected_samples`."""
        if (self.verify.samples_from_log is not None and self.data is None
                and self.verify.expected_samples is None):
            raise KeyedProblems([("verify.samples_from_log", "needs a count to compare with: "
                                  "a `data` block (muster scans it) or "
                                  "verify.expected_samples")])
        return self

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
