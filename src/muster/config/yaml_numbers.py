"""Numbers that YAML reads as strings, and what to write instead.

PyYAML reads YAML 1.1, where a float needs a dot and a signed exponent: `1e-5`, `1e5` and
`1.0e5` are strings, `1.0e-5` and `1.0e+5` are numbers. A person who writes `lr: 1e-5`
gets the string "1e-5", and "must be a number, got '1e-5'" would leave them puzzled.
`number_written_as_string` says what YAML did and the spelling it reads as the number, for
every numeric key of a config (`muster.config.problems` asks it for each type error, and
the search space for its bounds).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Protocol, cast

import yaml
from yaml.resolver import Resolver

__all__ = ["number_written_as_string", "yaml_spelling"]

# Decimal digits, an optional fraction and an optional exponent: what a person means as a
# number (Python's float() also takes "nan", "inf" and "1_0", which nobody means here).
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


class _Resolver(Protocol):
    def resolve(self, kind: type[yaml.Node], value: str, implicit: tuple[bool, bool]) -> str:
        ...


# types-PyYAML leaves `Resolver.resolve` unannotated; this is its signature (PyYAML's
# resolver.py): the tag a scalar node of that text would get.
_RESOLVER = cast(_Resolver, Resolver())


def number_written_as_string(value: object, whole: bool = False) -> str | None:
    """The problem to show for a numeric key whose value is the string `value`, when that
    string is a number: `YAML reads 1e-5 as a string: write 1.0e-5`, or, for a number that
    was quoted, to remove the quotes. None when `value` is no such string (the caller's own
    message applies).

    Args:
        whole: the key takes a whole number: the spelling offered is an integer, and a
            string that is not one is left to the caller's message.
    """
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not _DECIMAL.fullmatch(text):
        return None
    number = Decimal(text)
    if not math.isfinite(float(number)) or (whole and number != number.to_integral_value()):
        return None
    if _reads_as_number(text):  # unquoted, YAML would have read a number: it was quoted
        return (f"must be a {'whole ' if whole else ''}number, got {value!r}, which is quoted: "
                "remove the quotes")
    return f"YAML reads {text} as a string: write {yaml_spelling(text, whole)}"


def yaml_spelling(text: str, whole: bool = False) -> str:
    """`text` (a decimal number) spelt so that YAML 1.1 reads it as a number: a dot in the
    mantissa and a sign on the exponent (`1e-5` -> `1.0e-5`, `1e5` -> `1.0e+5`), or, for a
    whole number, its digits (`1e3` -> `1000`)."""
    if whole:
        return str(int(Decimal(text)))
    mantissa, _, exponent = text.replace("E", "e").partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent and exponent[0] not in "+-":
        exponent = "+" + exponent
    return mantissa + (f"e{exponent}" if exponent else "")


def _reads_as_number(text: str) -> bool:
    return _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) in _NUMBER_TAGS
