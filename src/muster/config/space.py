"""The hyperparameter search space: what the config's `hyperparameters` block says.

Determined's forms: a bare value (or `{type: const, val}`) is a constant; `int` and `double`
take `minval`/`maxval` (and `count`, the number of grid points); `log` takes the exponents
`minval`/`maxval` of `base` (default 10); `categorical` takes `vals`; a mapping without a
`type` key nests more hyperparameters. A parameter's name is its key path ("model.lr").

`parse` checks everything a submission can get wrong and names the key path of each problem,
so an invalid space never reaches a searcher.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from muster.config.yaml_numbers import number_written_as_string
from muster.rundir import Hparams

__all__ = [
    "Categorical",
    "Const",
    "Double",
    "Int",
    "Log",
    "Param",
    "SearchSpace",
    "SpaceProblems",
    "WrittenSpace",
    "parse",
]

# What a categorical value, or a sampled one, may be: Optuna's CategoricalChoiceType.
Scalar = None | bool | int | float | str
# The config's `hyperparameters` as written: nested mappings of ranges (`{type: ...}`) and
# constants (any YAML value), named by the user; `parse` reads it.
WrittenSpace = dict[str, Any]
MAX_INT_GRID = 1000  # an int range without `count` in a grid: every value, up to this many
_TYPES = ("const", "int", "double", "log", "categorical")


class SpaceProblems(ValueError):
    """Every problem found in a search space, each with the key path below `hyperparameters`."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {problem}" for path, problem in problems))


@dataclass(frozen=True)
class Const:
    val: Any


@dataclass(frozen=True)
class Int:
    minval: int
    maxval: int
    count: int | None = None

    def points(self) -> int:
        """How many values `grid` holds, without building it: rounded points that fall
        on one integer count once, so never more than the range's integers."""
        span = self.maxval - self.minval + 1
        return span if self.count is None else min(self.count, span)

    def grid(self) -> list[Scalar]:
        points = self.count or (self.maxval - self.minval + 1)
        return list(dict.fromkeys(round(x) for x in _linspace(self.minval, self.maxval,
                                                              points)))


@dataclass(frozen=True)
class Double:
    minval: float
    maxval: float
    count: int | None = None

    def points(self) -> int:
        assert self.count is not None, "checked by parse: a grid needs a count"
        return self.count

    def grid(self) -> list[Scalar]:
        assert self.count is not None, "checked by parse: a grid needs a count"
        return list(_linspace(self.minval, self.maxval, self.count))


@dataclass(frozen=True)
class Log:
    """`base ** x` for an exponent x in [minval, maxval]: log-uniform between the two."""

    minval: float
    maxval: float
    base: float = 10.0
    count: int | None = None

    @property
    def low(self) -> float:
        return float(self.base**self.minval)

    @property
    def high(self) -> float:
        return float(self.base**self.maxval)

    def points(self) -> int:
        assert self.count is not None, "checked by parse: a grid needs a count"
        return self.count

    def grid(self) -> list[Scalar]:
        assert self.count is not None, "checked by parse: a grid needs a count"
        return [float(self.base**x) for x in _linspace(self.minval, self.maxval, self.count)]


@dataclass(frozen=True)
class Categorical:
    vals: tuple[Scalar, ...]

    def points(self) -> int:
        return len(self.vals)

    def grid(self) -> list[Scalar]:
        return list(self.vals)


Param = Const | Int | Double | Log | Categorical
Searched = Int | Double | Log | Categorical


@dataclass(frozen=True)
class SearchSpace:
    """The parsed space: every parameter by its key path, in the order written."""

    params: dict[str, Param]

    def searched(self) -> dict[str, Searched]:
        """The parameters a searcher chooses (everything but constants)."""
        return {name: p for name, p in self.params.items() if not isinstance(p, Const)}

    def grid_problems(self, max_points: int) -> list[tuple[str, str]]:
        """What stops a grid over this space: a double or log range without `count`, an
        int range of more than MAX_INT_GRID values without one, or more than `max_points`
        points in all (counted, never built)."""
        problems: list[tuple[str, str]] = []
        for name, p in self.searched().items():
            if isinstance(p, Double | Log) and p.count is None:
                problems.append((f"{name}.count", "a grid search needs the number of points of "
                                 f"this {type(p).__name__.lower()} range; add e.g. `count: 4`"))
            elif isinstance(p, Int) and p.count is None and p.maxval - p.minval >= MAX_INT_GRID:
                problems.append((f"{name}.count", f"this int range holds "
                                 f"{p.maxval - p.minval + 1} values; a grid over all of them is "
                                 "surely a mistake: add e.g. `count: 4`"))
        if problems:
            return problems
        counts = {name: p.points() for name, p in self.searched().items()}
        size = math.prod(counts.values())  # exact, and cheap however large
        if size > max_points:
            biggest = max(counts, key=lambda name: counts[name])
            product = " x ".join(f"{name} {n}" for name, n in counts.items())
            shown = f"{size:,}" if size < 10**15 else f"about 10^{len(str(size)) - 1}"
            problems.append((biggest, f"the grid has {shown} points ({product}), more than "
                                      f"the {max_points:,} trials an experiment may run; "
                                      "use fewer points, or a random or tpe search"))
        return problems

    def grid_size(self) -> int:
        """How many points the grid holds, counted without building it."""
        return math.prod(p.points() for p in self.searched().values())

    def hparams(self, chosen: Mapping[str, Any]) -> Hparams:
        """The nested hparams a trial sees: the constants plus the chosen values."""
        nested: Hparams = {}
        for name, param in self.params.items():
            value = param.val if isinstance(param, Const) else chosen[name]
            *parents, leaf = name.split(".")
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return nested


def parse(tree: Mapping[str, Any]) -> SearchSpace:
    """The search space of a `hyperparameters` mapping.

    Raises:
        SpaceProblems: every problem, each with its key path (e.g. `lr.maxval`).
    """
    params: dict[str, Param] = {}
    problems: list[tuple[str, str]] = []
    for path, value in _leaves(tree, "", problems):
        param = _param(path, value, problems)
        if param is not None:
            params[path] = param
    if problems:
        raise SpaceProblems(problems)
    return SearchSpace(params)


def _leaves(tree: Mapping[str, Any], prefix: str,
            problems: list[tuple[str, str]]) -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if not isinstance(key, str) or not key or "." in key:
            problems.append((f"{prefix}{key}", "a hyperparameter name must be a non-empty "
                                               "string without '.'"))
            continue
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and "type" not in value:
            if not value:
                problems.append((path, "an empty mapping; give it hyperparameters, or write "
                                       "`{type: const, val: {}}` for an empty constant"))
            yield from _leaves(value, f"{path}.", problems)
        else:
            yield path, value


_KEYS = {
    "const": ({"val"}, set()),
    "int": ({"minval", "maxval"}, {"count"}),
    "double": ({"minval", "maxval"}, {"count"}),
    "log": ({"minval", "maxval"}, {"base", "count"}),
    "categorical": ({"vals"}, set()),
}


def _param(path: str, value: Any, problems: list[tuple[str, str]]) -> Param | None:
    if not isinstance(value, Mapping):
        return Const(value)  # a bare value is a constant
    kind = value["type"]
    if kind not in _TYPES:
        problems.append((f"{path}.type", f"must be one of {', '.join(_TYPES)}, got {kind!r}"))
        return None
    required, optional = _KEYS[kind]
    found = len(problems)
    for key in sorted(required - value.keys()):
        problems.append((f"{path}.{key}", f"required for type {kind}"))
    for key in sorted(value.keys() - required - optional - {"type"}):
        allowed = ", ".join(sorted(required | optional))
        problems.append((f"{path}.{key}", f"unknown key for type {kind}; allowed: {allowed}"))
    if len(problems) > found:
        return None
    if kind == "const":
        return Const(value["val"])
    if kind == "categorical":
        return _categorical(path, value["vals"], problems)
    return _range(path, kind, value, problems)


def _categorical(path: str, vals: Any, problems: list[tuple[str, str]]) -> Param | None:
    if not isinstance(vals, list) or not vals:
        problems.append((f"{path}.vals", "must be a non-empty list of values"))
        return None
    for i, val in enumerate(vals):
        if val is not None and not isinstance(val, bool | int | float | str):
            problems.append((f"{path}.vals[{i}]", f"must be a number, a string, true/false or "
                                                  f"null, got {type(val).__name__}"))
            return None
    if len(set(map(repr, vals))) != len(vals):
        problems.append((f"{path}.vals", "lists a value twice"))
        return None
    return Categorical(tuple(vals))


def _range(path: str, kind: str, value: Mapping[str, Any],
           problems: list[tuple[str, str]]) -> Param | None:
    found = len(problems)
    whole = kind == "int"
    for key in ("minval", "maxval"):
        bound = value[key]
        if isinstance(bound, bool) or not isinstance(bound, int | float) or (
                whole and not isinstance(bound, int)) or not math.isfinite(bound):
            what = "a whole number" if whole else "a finite number"
            problems.append((f"{path}.{key}", number_written_as_string(bound, whole)
                             or f"must be {what}, got {bound!r}"))
    count = value.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 1):
        problems.append((f"{path}.count", number_written_as_string(count, whole=True)
                         or f"must be a whole number >= 1, got {count!r}"))
    base = value.get("base", 10)
    if kind == "log" and (isinstance(base, bool) or not isinstance(base, int | float)
                          or not math.isfinite(base) or base <= 0 or base == 1):
        problems.append((f"{path}.base", number_written_as_string(base)
                         or f"must be a number > 0 other than 1, got {base!r}"))
    if len(problems) > found:
        return None
    low, high = value["minval"], value["maxval"]
    if low > high:
        problems.append((f"{path}.maxval", f"must be >= minval ({low}), got {high}"))
        return None
    if kind == "log" and 0 < low < 1 and 0 < high < 1:
        problems.append((path, _values_for_exponents(low, high, base)))
        return None
    if kind == "int":
        return Int(low, high, count)
    if kind == "double":
        return Double(float(low), float(high), count)
    log = Log(float(low), float(high), float(base), count)
    try:
        within = 0 < log.low < math.inf and 0 < log.high < math.inf
    except OverflowError:
        within = False
    if not within:
        problems.append((path, f"{base} ** {low} .. {base} ** {high} is out of the range of "
                               "a floating-point number; use smaller exponents"))
        return None
    return log


def _values_for_exponents(low: float, high: float, base: float) -> str:
    """The fix for a log range written as the values (`1.0e-5 .. 1.0e-2`) where its
    exponents are meant: as written it would search base ** 0.00001 .. base ** 0.01."""
    exponents = [_exponent(bound, base) for bound in (low, high)]
    shown = _short_number(base)
    return (f"minval {low:g} and maxval {high:g} are both between 0 and 1, so this searches "
            f"{shown} ** {low:g} .. {shown} ** {high:g} ({base ** low:.4g} .. "
            f"{base ** high:.4g}); type: log takes exponents, and these are exponents of base "
            f"{shown}: write minval: {exponents[0]}, maxval: {exponents[1]}")


def _exponent(value: float, base: float) -> str:
    """log_base(value), as a person writes it: -5, or -3.52."""
    return _short_number(round(math.log(value, base), 2))


def _short_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _linspace(low: float, high: float, points: int) -> Iterator[float]:
    if points == 1:
        yield (low + high) / 2 if low != high else low
        return
    for i in range(points):
        yield low + (high - low) * i / (points - 1)
