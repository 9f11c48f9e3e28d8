"""A drill's runs, planned: which faults, on what config (pure).

Each run of a drill is the user's experiment as it was submitted, changed only so that a
drill stays short and one run is one trial: its planned length scaled (`scale`: the
searcher's `max_length`, `verify.expected_length`, constant length hyperparameters and the
entrypoint's length flags such as `--epochs 15`), a search run as a single random draw,
and the label `drill`. What was scaled is said in the report.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from muster.config.loading import read_experiment_config
from muster.config.schema import ExperimentConfig
from muster.errors import ConfigError
from muster.states import DrillFault

__all__ = ["MAX_DRILL_FAULTS", "DrillOptions", "DrillPlan", "plan_drill"]

MAX_DRILL_FAULTS = len(DrillFault)
DEFAULT_SCALE = 0.1
LABEL = "drill"
# The names a script's length goes by: entrypoint flags (`--epochs 15`, `--max_iters=50`)
# and constant hyperparameters (`epochs: 15`).
LENGTH_NAMES = frozenset({
    "epochs", "max_epochs", "num_epochs", "num_train_epochs", "n_epochs", "steps",
    "max_steps", "num_steps", "train_steps", "total_steps", "max_iters", "iters",
    "iterations", "max_iterations"})
# What a single draw keeps of a search's searcher (its metric, length and warm start).
_KEPT_SEARCHER_KEYS = ("metric", "smaller_is_better", "max_length", "max_length_unit",
                       "source_trial_id", "source_checkpoint_uuid", "source_model",
                       "source_checkpoint")
_FLAG = re.compile(r"--([A-Za-z_][A-Za-z0-9_-]*)(?:=(.*))?")


@dataclass(frozen=True)
class DrillOptions:
    """How a drill was asked for (`muster drill`'s options; stored as `drills.options`)."""

    faults: tuple[DrillFault, ...] = tuple(DrillFault)
    scale: float = DEFAULT_SCALE
    data: str | None = None  # the data directory inside the context, where data.path is not
    at: float = 0.5  # when a mid-run fault is injected: this fraction of the run
    source_experiment: int | None = None  # "Run a drill" on an experiment's page

    def __post_init__(self) -> None:
        if not 0 < self.scale <= 1:
            raise ConfigError(f"--scale must be above 0 and at most 1, got {self.scale}")
        if not 0 < self.at < 1:
            raise ConfigError(f"--at must lie between 0 and 1 (a fraction of the run), "
                              f"got {self.at}")
        if self.data is not None and (self.data.startswith("/") or ".." in self.data.split("/")
                                      or not self.data.strip()):
            raise ConfigError(f"--data names a directory inside the context, relative to "
                              f"it, got {self.data!r}")

    def to_json(self) -> dict[str, Any]:
        return {"faults": [str(f) for f in self.faults], "scale": self.scale,
                "data": self.data, "at": self.at,
                "source_experiment": self.source_experiment}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DrillOptions:
        return cls(faults=tuple(DrillFault(f) for f in data["faults"]), scale=data["scale"],
                   data=data.get("data"), at=data.get("at", 0.5),
                   source_experiment=data.get("source_experiment"))


@dataclass(frozen=True)
class DrillPlan:
    """The config every run of a drill is made from, and what was scaled in it."""

    name: str
    config: ExperimentConfig  # the drilled config, validated
    data: dict[str, Any]  # its muster config as data (a Determined one translated)
    scaled: list[str] = field(default_factory=list)  # "--epochs 15 → 2", …

    def run_config(self, drill_id: int, run: str) -> str:
        """The YAML of one run: `run` is "clean" or a fault's name."""
        data = dict(self.data)
        data["name"] = f"{self.name} (drill {drill_id}: {run})"[:128]
        labels = [str(x) for x in data.get("labels") or []]
        data["labels"] = [*labels, LABEL] if LABEL not in labels else labels
        return yaml.safe_dump(data, sort_keys=False)


def plan_drill(config_text: str, scale: float, source: str = "the drilled config"
               ) -> DrillPlan:
    """The drill's plan for a submitted config.

    Raises:
        ConfigError: the config is invalid (as `experiment create` would say).
    """
    loaded = read_experiment_config(config_text, source=source)
    raw = (loaded.translation.config if loaded.translation is not None
           else yaml.safe_load(config_text))
    data: dict[str, Any] = dict(raw)
    scaled: list[str] = []
    data["entrypoint"] = _scale_entrypoint(data["entrypoint"], scale, scaled)
    data["hyperparameters"] = _scale_hparams(data.get("hyperparameters") or {}, scale, scaled)
    if not data["hyperparameters"]:
        del data["hyperparameters"]
    data["searcher"] = _single_draw(dict(data.get("searcher") or {}), scale, scaled)
    verify = dict(data.get("verify") or {})
    if isinstance(verify.get("expected_length"), dict):
        verify["expected_length"] = {unit: _scaled(n, scale, f"verify.expected_length.{unit}",
                                                   scaled)
                                     for unit, n in verify["expected_length"].items()}
        data["verify"] = verify
    return DrillPlan(loaded.config.name, loaded.config, data, scaled)


def _scaled(n: Any, scale: float, what: str, scaled: list[str]) -> Any:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return n
    new = max(1, math.ceil(n * scale))
    if new != n:
        scaled.append(f"{what} {n} → {new}")
    return new


def _scale_entrypoint(entrypoint: Any, scale: float, scaled: list[str]) -> list[str]:
    words = shlex.split(entrypoint) if isinstance(entrypoint, str) else [str(w) for w in
                                                                         entrypoint]
    out: list[str] = []
    pending: str | None = None
    for word in words:
        if pending is not None and word.isdigit():
            out.append(str(_scaled(int(word), scale, pending, scaled)))
            pending = None
            continue
        pending = None
        match = _FLAG.fullmatch(word)
        name = match.group(1).replace("-", "_") if match else None
        if match and name in LENGTH_NAMES:
            if match.group(2) is None:
                pending = f"--{match.group(1)}"
            elif match.group(2).isdigit():
                word = f"--{match.group(1)}=" + str(
                    _scaled(int(match.group(2)), scale, f"--{match.group(1)}", scaled))
        out.append(word)
    return out


def _scale_hparams(space: dict[str, Any], scale: float, scaled: list[str]) -> dict[str, Any]:
    out = dict(space)
    for name, value in space.items():
        if name not in LENGTH_NAMES:
            continue
        if isinstance(value, int):
            out[name] = _scaled(value, scale, f"hyperparameters.{name}", scaled)
        elif isinstance(value, dict) and value.get("type") == "const":
            out[name] = {**value, "val": _scaled(value.get("val"), scale,
                                                 f"hyperparameters.{name}", scaled)}
    return out


def _single_draw(searcher: dict[str, Any], scale: float, scaled: list[str]) -> dict[str, Any]:
    """One trial: a search becomes one random draw of its space, its length scaled."""
    name = searcher.get("name", "single")
    kept: dict[str, Any] = {key: searcher[key] for key in _KEPT_SEARCHER_KEYS
                            if key in searcher}
    if isinstance(kept.get("max_length"), int):
        kept["max_length"] = _scaled(kept["max_length"], scale, "searcher.max_length", scaled)
    elif isinstance(kept.get("max_length"), dict):
        kept["max_length"] = {u: _scaled(n, scale, f"searcher.max_length.{u}", scaled)
                              for u, n in kept["max_length"].items()}
    if name == "single":
        return {"name": "single", **kept}
    scaled.append(f"searcher {name} → one random draw")
    return {"name": "random", "max_trials": 1, **kept}
