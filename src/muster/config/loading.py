"""Read an experiment config from YAML text or a file into an `ExperimentConfig`.

YAML is read with a safe loader (no Python objects from a config) that also refuses
duplicate keys: plain `safe_load` keeps the last of two `failure_policy:` blocks silently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from muster.config.problems import config_error, show_value, validate_config_data
from muster.config.schema import ExperimentConfig
from muster.errors import ConfigError

__all__ = ["load_config", "load_config_file", "parse_yaml", "read_config_text"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictSafeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that rejects a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                )
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def load_config(text: str, source: str = "<config>") -> ExperimentConfig:
    """Parse and validate an experiment config written in YAML.

    Args:
        text: the YAML document.
        source: where it came from (a file name), used in error messages.

    Raises:
        ConfigError: invalid YAML, or every validation problem, one per line.
    """
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise config_error(source, [f"(top level): {_not_a_mapping(data)}"])
    return validate_config_data(ExperimentConfig, data, source)


def load_config_file(path: str | os.PathLike[str]) -> ExperimentConfig:
    """Read, parse and validate the experiment config at `path`.

    Raises:
        ConfigError: the file cannot be read, or its config is invalid.
    """
    source = os.fspath(path)
    return load_config(read_config_text(source), source=source)


def read_config_text(source: str, what: str = "config") -> str:
    """The UTF-8 text of the config file `source`.

    Raises:
        ConfigError: the file cannot be read ("cannot read the {what} file ...") or is not
            UTF-8 text.
    """
    try:
        return Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {source}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_yaml(text: str, source: str) -> object:
    """The data in the YAML document `text`: safe types only, no key given twice.

    Raises:
        ConfigError: invalid YAML, naming `source`, the line and the column.
    """
    try:
        return yaml.load(text, Loader=_StrictSafeLoader)  # a SafeLoader: no Python objects
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_yaml_message(exc, source)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None


def _not_a_mapping(data: object) -> str:
    if data is None:
        return "the config is empty; it needs at least 'name' and 'entrypoint'"
    return f"must be a mapping of keys such as 'name:' and 'entrypoint:', got {show_value(data)}"


def _yaml_message(exc: yaml.MarkedYAMLError, source: str) -> str:
    message = f"{source}{_at(exc.problem_mark)}: invalid YAML: {exc.problem or 'not valid YAML'}"
    if exc.context and exc.context_mark is not None:
        # e.g. where an unclosed '[' started, which is the line to fix, not where the file ended
        message += f" ({exc.context}{_at(exc.context_mark)})"
    return message


def _at(mark: yaml.Mark | None) -> str:
    return f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
