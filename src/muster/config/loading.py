"""Read an experiment config from YAML text or a file into an `ExperimentConfig`.

YAML is read with a safe loader (no Python objects from a config) that also refuses
duplicate keys: plain `safe_load` keeps the last of two `failure_policy:` blocks silently.

A config comes from whoever can reach the server, so reading one is bounded before it costs
memory or time: the text is at most MAX_CONFIG_BYTES, anchors and aliases are refused (a
592-byte "billion laughs" document expands to gigabytes), nesting stops at MAX_DEPTH, and
every string is at most MAX_STRING_CHARS and holds no NUL byte (which no file name,
argument or environment variable can carry). Each problem names its key path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from muster.config.problems import config_error, key_path, show_value, validate_config_data
from muster.config.schema import SUBMISSION, ExperimentConfig
from muster.errors import ConfigError

__all__ = ["load_config", "load_config_file", "parse_yaml", "read_config_text"]

_MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_CONFIG_BYTES = 1024**2
MAX_DEPTH = 32  # mappings and lists within each other
MAX_STRING_CHARS = 64 * 1024


class _Refused(yaml.YAMLError):
    """What the loader refuses to build, with where in the text it is."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem, self.mark = problem, mark


class _StrictSafeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that rejects a key given twice in one mapping, anchors and aliases,
    and nesting deeper than MAX_DEPTH (checked before it recurses, not by RecursionError)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused("anchors and aliases (&name, *name, <<: *name) are not accepted in "
                           "a muster config: write each value out", event.start_mark)
        nests = isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent)
        if nests and self._depth >= MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep; a config needs far "
                           "fewer", event.start_mark)
        self._depth += nests
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= nests

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
    """Parse and validate an experiment config written in YAML, as a submission: with the
    rules a stored config is not judged by again (`schema.SUBMISSION`).

    Args:
        text: the YAML document.
        source: where it came from (a file name), used in error messages.

    Raises:
        ConfigError: invalid YAML, or every validation problem, one per line.
    """
    data = parse_yaml(text, source)
    problems = list(_string_problems(data, []))
    if problems:
        raise config_error(source, problems[:20])
    if not isinstance(data, dict):
        raise config_error(source, [f"(top level): {_not_a_mapping(data)}"])
    return validate_config_data(ExperimentConfig, data, source, context=SUBMISSION)


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
        ConfigError: invalid YAML, naming `source`, the line and the column; or text past
            the bounds in the module docstring.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: the config is {size:,} bytes, over the "
                          f"{MAX_CONFIG_BYTES // 1024**2} MiB limit; keep data and long lists "
                          "in files the script reads")
    try:
        return yaml.load(text, Loader=_StrictSafeLoader)  # a SafeLoader: no Python objects
    except _Refused as exc:
        raise ConfigError(f"{source}{_at(exc.mark)}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_yaml_message(exc, source)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None


def _string_problems(data: object, at: list[int | str]) -> Iterator[str]:
    """Strings (keys too) that are too long or hold a NUL byte, by key path."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _string_problems(key, at)
            yield from _string_problems(value, [*at, str(key)[:80]])
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _string_problems(value, [*at, i])
    elif isinstance(data, str):
        if "\x00" in data:
            yield (f"{key_path(at)}: holds a NUL byte (\\0), which no argument, path or "
                   "environment variable can carry; remove it")
        if len(data) > MAX_STRING_CHARS:
            yield (f"{key_path(at)}: a string of {len(data):,} characters, over the limit of "
                   f"{MAX_STRING_CHARS:,}; keep long text in a file the script reads")


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
