"""Turn pydantic validation errors into config problems a person can act on.

Each problem is one line, `<key path>: <what is wrong>`, e.g.
`failure_policy.trial_retries: must be >= 0, got -1`. pydantic's own wording and its
documentation URLs never reach the user: they name pydantic's concepts, not the config's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from muster.config.yaml_numbers import number_written_as_string
from muster.errors import ConfigError

__all__ = [
    "KeyedProblems",
    "config_error",
    "describe_error",
    "key_path",
    "show_value",
    "validate_config_data",
]

ModelT = TypeVar("ModelT", bound=BaseModel)
# pydantic's `ErrorDetails["ctx"]`: its keys depend on the error's type (`min_length`,
# `expected`, `error`...), free as pydantic gives them.
ErrorContext = dict[str, Any]

_EXPECTED = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping (key: value pairs)",
    "model_type": "a mapping (key: value pairs)",
    "model_attributes_type": "a mapping (key: value pairs)",
}
_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


def validate_config_data(
    model: type[ModelT], data: object, source: str, what: str = "experiment config",
    context: Mapping[str, bool] | None = None,
) -> ModelT:
    """Validate plain data (parsed YAML or stored JSON) into `model`.

    Args:
        what: the kind of config, for the error's header ("invalid cluster config:").
        context: pydantic's validation context (`schema.SUBMISSION` for a new config).

    Raises:
        ConfigError: listing every problem, one `<key path>: <problem>` line each.
    """
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = [describe_error(e, model) for e in exc.errors()]
        raise config_error(source, problems, what) from None


def config_error(
    source: str, problems: Iterable[str], what: str = "experiment config"
) -> ConfigError:
    """One ConfigError for all problems, so a person fixes them in one go, not one per run."""
    unique = list(dict.fromkeys(problems))
    return ConfigError("\n".join([f"{source}: invalid {what}:", *unique]))


def key_path(loc: Sequence[int | str]) -> str:
    """A pydantic location as the person reads it: `failure_policy.transient_exit_codes[0]`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]":  # pydantic's marker for "the problem is this dict key"
            path += f".{part}" if path else part
    return path or "(top level)"


class KeyedProblems(ValueError):
    """Raised by a validator for problems below the key it validates, each with its key path
    relative to that key (`max_trials` under `searcher`); `describe_error` joins the paths.
    Any ValueError with such a `problems` list is read the same way (see SpaceProblems)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {problem}" for path, problem in problems))


def describe_error(error: ErrorDetails, root: type[BaseModel]) -> str:
    """One `<key path>: <problem>` line for one pydantic error found validating `root` (one
    per problem where a validator found several below its key)."""
    loc = tuple(error["loc"])
    nested = getattr(error.get("ctx", {}).get("error"), "problems", None)
    if error["type"] == "value_error" and isinstance(nested, list):
        return "\n".join(f"{key_path(loc + _parts(str(path)))}: {problem}"
                         for path, problem in nested)
    if error["type"] == "extra_forbidden":
        problem = _unknown_key(str(loc[-1]), _section_at(root, loc[:-1]), error["input"])
    else:
        problem = _number_as_string(error, root) or _problem(error)
    return f"{key_path(loc)}: {problem}"


_NUMBER_ERRORS = {"int_type": True, "int_parsing": True, "float_type": False,
                  "float_parsing": False}  # -> whether the key takes a whole number


def _number_as_string(error: ErrorDetails, root: type[BaseModel]) -> str | None:
    """For a numeric key given a string that is a number (`1e-5`, which YAML 1.1 reads as a
    string; or a quoted one): what to write. Asked of every key, so each numeric key of every
    section says it the same way, also where a validator of its own (a duration, a size)
    refused the string."""
    kind, value = error["type"], error["input"]
    if kind in _NUMBER_ERRORS:
        return number_written_as_string(value, whole=_NUMBER_ERRORS[kind])
    if kind == "value_error" and isinstance(value, str):
        whole = _takes_a_number(_annotation_at(root, tuple(error["loc"])))
        # Only YAML's trap here: a validator's own message is better for a quoted value.
        found = number_written_as_string(value, whole=bool(whole)) if whole is not None else None
        return found if found is not None and found.startswith("YAML") else None
    return None


def _annotation_at(root: type[BaseModel], loc: Sequence[int | str]) -> object:
    """The type annotation of the key at `loc` (None where `loc` is no model field)."""
    if not loc or not isinstance(loc[-1], str):
        return None
    section = _section_at(root, loc[:-1])
    field = section.model_fields.get(loc[-1]) if section is not None else None
    return field.annotation if field is not None else None


def _takes_a_number(annotation: object) -> bool | None:
    """True for a key that takes a whole number (`int`, `int | None`), False for any
    number (`float`), None for a key that takes text (or anything else)."""
    kinds = {arg for arg in (get_args(annotation) or (annotation,)) if arg is not type(None)}
    if kinds == {int}:
        return True
    if kinds and kinds <= {int, float}:
        return False
    return None


def _parts(path: str) -> tuple[int | str, ...]:
    """A relative key path's parts; `[3]` is list index 3."""
    return tuple(int(part[1:-1]) if re.fullmatch(r"\[[0-9]+\]", part) else part
                 for part in path.split("."))


def _problem(error: ErrorDetails) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error["input"]
    describe = _DESCRIBERS.get(kind)
    if describe is not None:
        return describe(ctx, value)
    if kind == "string_type" and isinstance(value, int | float):
        return f"must be a string, got {show_value(value)}; put it in quotes"
    if kind in _EXPECTED:
        return f"must be {_EXPECTED[kind]}, got {show_value(value)}"
    if kind in _BOUNDS:
        symbol, bound = _BOUNDS[kind]
        return f"must be {symbol} {ctx[bound]}, got {show_value(value)}"
    return f"invalid value {show_value(value)}"


def _missing(ctx: ErrorContext, value: object) -> str:
    return "required key is missing"


def _value_error(ctx: ErrorContext, value: object) -> str:
    return str(ctx["error"])  # our own validators' messages, already written for people


def _literal(ctx: ErrorContext, value: object) -> str:
    return f"must be {ctx['expected']}, got {show_value(value)}"


def _too_short(ctx: ErrorContext, value: object) -> str:
    if ctx["min_length"] == 1:
        return "must not be empty"
    return f"must have at least {ctx['min_length']} items"


def _string_too_short(ctx: ErrorContext, value: object) -> str:
    if ctx["min_length"] == 1:
        return "must not be empty"
    return f"must be at least {ctx['min_length']} characters long"


def _string_too_long(ctx: ErrorContext, value: object) -> str:
    length = len(value) if isinstance(value, str) else "more"
    return f"must be at most {ctx['max_length']} characters long, got {length}"


def _too_long(ctx: ErrorContext, value: object) -> str:
    return f"must have at most {ctx['max_length']} items"


_DESCRIBERS: dict[str, Callable[[ErrorContext, object], str]] = {
    "missing": _missing,
    "value_error": _value_error,
    "assertion_error": _value_error,
    "literal_error": _literal,
    "enum": _literal,
    "too_short": _too_short,
    "too_long": _too_long,
    "string_too_short": _string_too_short,
    "string_too_long": _string_too_long,
}


def _unknown_key(key: str, section: type[BaseModel] | None, value: object) -> str:
    foreign: dict[str, str] = getattr(section, "FOREIGN_KEYS", {})
    if key in foreign:
        return f"not a muster key (Determined has it): {foreign[key]}"
    planned: frozenset[str] = getattr(section, "PLANNED_KEYS", frozenset())
    if key in planned:
        noun = "section" if value is None or isinstance(value, dict) else "setting"
        return f"this {noun} is not supported by this version of muster yet; remove it"
    valid = sorted(section.model_fields) if section is not None else []
    close = difflib.get_close_matches(key, valid, n=1)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    if valid:
        return f"unknown key; the keys allowed here are {', '.join(valid)}"
    return "unknown key"


def _section_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that validates the mapping found at `loc`, to know which keys it allows."""
    section: type[BaseModel] | None = root
    keyed = False  # the part before was a mapping of names to sections (`quotas.users`)
    for part in loc:
        if section is None:
            return None
        if isinstance(part, str) and not keyed:
            field = section.model_fields.get(part)
            section = _model_in(field.annotation) if field is not None else None
            keyed = field is not None and get_origin(field.annotation) is dict
        else:
            keyed = False
    return section


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def show_value(value: object) -> str:
    """A value as the person wrote it in YAML, short enough for one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
