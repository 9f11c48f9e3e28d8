"""Read an experiment config from YAML text or a file into an `ExperimentConfig`: muster's
own, or a Determined AI config, recognised and translated (`muster.config.determined`).

YAML is read with a safe loader (no Python objects from a config) that also refuses
duplicate keys: plain `safe_load` keeps the last of two `failure_policy:` blocks silently.

A config comes from whoever can reach the server, so reading one is bounded before it costs
memory or time: the text is at most MAX_CONFIG_BYTES, anchors and aliases are refused (a
592-byte "billion laughs" document expands to gigabytes), nesting stops at MAX_DEPTH, a
document has at most MAX_NODES nodes (scalars, lists and mappings), an integer at most
MAX_INTEGER_DIGITS digits (Python refuses to read one of 4,300), every string is at most
MAX_STRING_CHARS and holds no NUL byte (which no file name, argument or environment variable
can carry), and every float is finite (`.nan`, `.inf`, and a number too large for a float,
have no JSON spelling). Each problem names its key path, or its line where it is refused
while the text is read.

The text is scanned and parsed by libyaml (`CParser`): PyYAML's pure-Python scanner took
3-5 s of a core for a 1 MiB config of constants (an audit saw 44-95 s on a busy server),
before any bound could be checked; with libyaml it takes a fifth. The composer, where the
bounds are checked node by node, and the constructor stay PyYAML's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml._yaml import CParser, Mark
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from muster.config import determined
from muster.config.problems import config_error, key_path, show_value, validate_config_data
from muster.config.schema import SUBMISSION, ExperimentConfig
from muster.errors import ConfigError

__all__ = [
    "LoadedConfig",
    "load_config",
    "load_config_file",
    "parse_yaml",
    "read_config_text",
    "read_experiment_config",
    "read_experiment_config_file",
]

_MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_CONFIG_BYTES = 1024**2
MAX_DEPTH = 32  # mappings and lists within each other
MAX_STRING_CHARS = 64 * 1024
MAX_NODES = 100_000  # scalars, lists and mappings in one document
MAX_INTEGER_DIGITS = 100
_INT_TAG = "tag:yaml.org,2002:int"


class _Refused(yaml.YAMLError):
    """What the loader refuses to build, with where in the text it is."""

    def __init__(self, problem: str, mark: yaml.Mark | Mark | None) -> None:
        super().__init__(problem)
        self.problem, self.mark = problem, mark


class _StrictSafeLoader(Composer, CParser, SafeConstructor, Resolver):
    """`yaml.SafeLoader`'s composer and constructor over libyaml's parser, rejecting a key
    given twice in one mapping, anchors and aliases, nesting deeper than MAX_DEPTH (checked
    before it recurses, not by RecursionError), more than MAX_NODES nodes, and integers of
    more than MAX_INTEGER_DIGITS digits."""

    def __init__(self, stream: str) -> None:
        CParser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        mark = None if event is None else event.start_mark
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused("anchors and aliases (&name, *name, <<: *name) are not accepted in "
                           "a muster config: write each value out", mark)
        nests = isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent)
        if nests and self._depth >= MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep; a config needs far "
                           "fewer", mark)
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values (scalars, lists and mappings) in "
                           "one config; keep long lists in files the script reads", mark)
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

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int:
        """An integer, refused before `int()` reads it when it has too many digits."""
        written = node.value.lstrip("+-").removeprefix("0x").removeprefix("0b")
        digits = sum(char.isalnum() for char in written)  # '_' and ':' aside
        if digits > MAX_INTEGER_DIGITS:
            raise _Refused(f"an integer of {digits:,} digits, over the limit of "
                           f"{MAX_INTEGER_DIGITS}; write a smaller number, or quote it as "
                           "a string", node.start_mark)
        return int(self.construct_yaml_int(node))

    yaml_constructors = {**SafeConstructor.yaml_constructors,
                         _INT_TAG: construct_bounded_int}


@dataclass(frozen=True)
class LoadedConfig:
    """A submitted config, validated; when it was a Determined config, what each of its keys
    became (`muster.config.determined`)."""

    config: ExperimentConfig
    translation: determined.Translation | None = None


def read_experiment_config(text: str, source: str = "<config>",
                           slots: determined.SlotKind = "gpu") -> LoadedConfig:
    """Parse and validate an experiment config written in YAML, as a submission: with the
    rules a stored config is not judged by again (`schema.SUBMISSION`). A Determined config
    (`determined.detect`) is translated first, and validated as the muster config it makes.

    Args:
        text: the YAML document.
        source: where it came from (a file name), used in error messages.
        slots: what a Determined config's slots are where it will run
            (`determined.translate`).

    Raises:
        ConfigError: invalid YAML, what a Determined config asks that muster cannot do, or
            every validation problem, one per line.
    """
    data = parse_yaml(text, source)
    problems = list(_value_problems(data, []))
    if problems:
        raise config_error(source, problems[:20])
    if not isinstance(data, dict):
        raise config_error(source, [f"(top level): {_not_a_mapping(data)}"])
    if not determined.detect(data).is_determined:
        return LoadedConfig(validate_config_data(ExperimentConfig, data, source,
                                                 context=SUBMISSION))
    translation = determined.translate(data, source, slots)
    config = validate_config_data(ExperimentConfig, translation.config, source,
                                  what="experiment config (translated from Determined's)",
                                  context=SUBMISSION)
    return LoadedConfig(config, translation)


def read_experiment_config_file(path: str | os.PathLike[str]) -> LoadedConfig:
    """Read, parse and validate the experiment config at `path` (`read_experiment_config`).

    Raises:
        ConfigError: the file cannot be read, or its config is invalid.
    """
    source = os.fspath(path)
    return read_experiment_config(read_config_text(source), source=source)


def load_config(text: str, source: str = "<config>") -> ExperimentConfig:
    """The config of `read_experiment_config`, muster's or translated from Determined's."""
    return read_experiment_config(text, source).config


def load_config_file(path: str | os.PathLike[str]) -> ExperimentConfig:
    """The config of `read_experiment_config_file`."""
    return read_experiment_config_file(path).config


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
        return _load(text)
    except _Refused as exc:
        raise ConfigError(f"{source}{_at(exc.mark)}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_yaml_message(exc, source)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None


def _load(text: str) -> object:
    """What `yaml.load` does, with the loader above (safe types only: no Python objects)."""
    loader = _StrictSafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _value_problems(data: object, at: list[int | str]) -> Iterator[str]:
    """Strings (keys too) that are too long or hold a NUL byte, and floats that are not
    finite, by key path."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _value_problems(key, at)
            yield from _value_problems(value, [*at, str(key)[:80]])
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _value_problems(value, [*at, i])
    elif isinstance(data, float) and not math.isfinite(data):
        yield (f"{key_path(at)}: {data} is not a number muster can keep (YAML's .nan, .inf "
               "and -.inf, or a number too large for a float); write a finite number")
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


def _at(mark: yaml.Mark | Mark | None) -> str:
    return f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
