"""The pydantic model of a `muster.api` shape: one spelling of the contract, checked at the door.

`shape(api.TrialDetail)` is a pydantic model with the TypedDict's fields, types and order,
its docstring as the model's description and each field's comment as the field's, so
`/openapi.json` says what `muster/api.py` says. Nested shapes become nested models; every
model forbids keys its shape does not name and requires every key it does.
"""

from __future__ import annotations

import inspect
import io
import sys
import tokenize
import types
import typing
from functools import cache
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

from pydantic import BaseModel, ConfigDict, Field, create_model

_FORBID = ConfigDict(extra="forbid")


@cache
def shape(typed: type) -> type[BaseModel]:
    """The pydantic model of the TypedDict `typed` (made once per shape).

    Raises:
        TypeError: `typed` is not a TypedDict.
    """
    if not is_typeddict(typed):
        raise TypeError(f"{typed!r} is not a TypedDict: only muster.api's shapes have models")
    notes = field_notes(sys.modules[typed.__module__]).get(typed.__name__, {})
    hints = get_type_hints(typed, include_extras=True)
    fields: dict[str, Any] = {
        name: (_translate(hint), Field(description=notes.get(name)))
        for name, hint in hints.items()
    }
    model: type[BaseModel] = create_model(
        typed.__name__, __config__=_FORBID, __doc__=_docstring(typed),
        __module__=__name__, **fields)
    return model


def _docstring(typed: type) -> str | None:
    """`typed`'s own docstring (`inspect.getdoc` would give a shape without one `dict`'s)."""
    own = vars(typed).get("__doc__")
    return inspect.cleandoc(own) if own else None


def many(model: type[BaseModel]) -> Any:
    """A JSON array of `model`'s objects, as a route's `response_model`."""
    return types.GenericAlias(list, (model,))  # `list[model]`, spelt for a variable


def one_or_many(model: type[BaseModel]) -> Any:
    """One of `model`'s objects or an array of them, as a route's `response_model`."""
    return model | types.GenericAlias(list, (model,))


def _translate(hint: Any) -> Any:
    """`hint` with every TypedDict in it replaced by its model."""
    if is_typeddict(hint):
        return shape(hint)
    origin, args = get_origin(hint), get_args(hint)
    if origin is None or not args or origin is typing.Literal:
        return hint
    translated = tuple(_translate(arg) for arg in args)
    if origin is typing.Annotated:
        return typing.Annotated[(translated[0], *hint.__metadata__)]
    if origin in (Union, types.UnionType):
        return Union[translated]  # noqa: UP007 - built from a tuple of types
    return origin[translated if len(translated) > 1 else translated[0]]


@cache
def field_notes(module: types.ModuleType) -> dict[str, dict[str, str]]:
    """The comments of each shape's fields in `module`'s source, by class and field (those
    of the shape it extends included): the comment lines right above a field, then the
    comment on its line."""
    notes: dict[str, dict[str, str]] = {}
    klass: str | None = None
    above: list[str] = []
    for line in _lines_with_comments(inspect.getsource(module)):
        code, _, comment = line.partition("#")
        stripped = code.strip()
        if code.startswith("class "):
            klass, base = code[6:].rstrip(": ").rstrip(")").split("(")
            notes[klass], above = dict(notes.get(base, {})), []
        elif klass and not stripped and comment:
            above.append(comment.strip())
        elif klass and code.startswith("    ") and ":" in stripped:
            name = stripped.split(":")[0]
            text = " ".join([*above, comment.strip()] if comment else above)
            if name.isidentifier() and text:
                notes[klass][name] = text
            above = []
        elif not line.startswith("    ") and stripped:
            klass, above = None, []
    return notes


def _lines_with_comments(source: str) -> list[str]:
    """`source`'s lines, with a `#` only where tokenize found a comment (not in a string)."""
    comments: dict[int, tuple[int, str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.start[1], token.string[1:])
    lines = []
    for number, line in enumerate(source.splitlines(), start=1):
        column, comment = comments.get(number, (len(line), None))
        code = line[:column].replace("#", "")
        lines.append(code if comment is None else f"{code}#{comment}")
    return lines
