"""Column types of the store's own: the words of `muster.states` as typed columns.

A state column holds the same text as ever (the member's value), so typing a column is no
migration; what changes is what Python reads back: the member, never a free string, so the
code compares `trial.state is TrialState.RUNNING` and mypy knows the column's words.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from sqlalchemy import Dialect, String, event
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

__all__ = ["EnumText", "coerce_words_on_set"]

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

    def member(self, word: Any) -> E | None:
        """`word` (a member, or one of the enum's words) as the member; None stays None."""
        return None if word is None else self._member(word)

    def _member(self, word: Any) -> E:
        try:
            return self._members[word]
        except (KeyError, TypeError):
            return self.enum(word)  # raises ValueError, with the enum's own message


def coerce_words_on_set(base: type[DeclarativeBase]) -> None:
    """Make every `EnumText` attribute of `base`'s models hold a member as soon as it is
    set (`Trial(state="QUEUED")`, `row.state = "RUNNING"`), not only once read back: code
    asks the member (`trial.state.is_terminal()`) of rows it has just made too.

    Raises (when a word is set):
        ValueError: the word is not one of the column's enum.
    """
    for mapper in base.registry.mappers:
        for prop in mapper.column_attrs:
            column_type = prop.columns[0].type
            if isinstance(column_type, EnumText):
                event.listen(getattr(mapper.class_, prop.key), "set",
                             _coercer(column_type), retval=True)


def _coercer(column_type: EnumText[Any]) -> Any:
    def coerce(target: object, value: Any, old: object, initiator: object) -> Any:
        return column_type.member(value)
    return coerce
