"""The HTTP API reference page, from the server's own `/openapi.json` (the site's hook runs it).

`python scripts/http_reference.py` prints the page. The app is built in-process on a
throw-away home and asked for its OpenAPI document: no server runs, nothing listens.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HEADER = """# HTTP API reference

Generated from the server's `/openapi.json` when the site is built; that document is the
contract (a schemathesis run in `make test` holds the server to it). Every route is under
`/api/v1` and takes an API token (`Authorization: Bearer mst_...`) or a web session's
cookie, except `/health` and `/login`. Every error is an [`Error`](#schema-error) with a status the
route lists. The shapes most clients read are explained field by field in the
[JSON contract](json-contract.md).
"""
SCHEMA_PREFIX = "#/components/schemas/"
# What pydantic says of a class without a docstring of its own (a TypedDict's is dict's).
INHERITED_DOCS = {dict.__doc__, "Successful Response"}


def openapi_document() -> dict[str, Any]:
    """The app's OpenAPI document, made in this process on a temporary home."""
    from muster.home import Home
    from muster.server.app import create_app

    with tempfile.TemporaryDirectory(prefix="muster-openapi-") as root:
        document: dict[str, Any] = create_app(Home(Path(root))).openapi()
    return document


def page(document: dict[str, Any]) -> str:
    """Each route grouped by its first path word, then every schema with its fields."""
    parts = [HEADER]
    for group, routes in _groups(document["paths"]).items():
        parts += [f"## {group.capitalize()}", ""]
        parts += [_operation(method, path, operation) for path, method, operation in routes]
    parts += ["## Schemas", ""]
    parts += [_schema(name, schema)
              for name, schema in sorted(document["components"]["schemas"].items())]
    return "\n".join(parts)


def _groups(paths: dict[str, Any]) -> dict[str, list[tuple[str, str, dict[str, Any]]]]:
    groups: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in paths.items():
        group = path.removeprefix("/api/v1/").split("/")[0]
        for method, operation in operations.items():
            groups.setdefault(group, []).append((path, method, operation))
    return groups


def _operation(method: str, path: str, operation: dict[str, Any]) -> str:
    lines = [f"### `{method.upper()} {path}`", "", f"**{operation.get('summary', '')}.** "
             f"{operation.get('description', '')}".rstrip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| Parameter | In | Type | Description |", "|---|---|---|---|"]
        lines += [f"| `{p['name']}`{'' if p.get('required') else ' (optional)'} | {p['in']} | "
                  f"{type_of(p['schema'])} | {_cell(p.get('description', ''))} |"
                  for p in parameters]
        lines.append("")
    lines += list(_body(operation.get("requestBody")))
    lines += ["| Status | Answer |", "|---|---|"]
    lines += [f"| {status} | {_answer(response)} |"
              for status, response in sorted(operation["responses"].items())]
    return "\n".join([*lines, ""])


def _body(body: dict[str, Any] | None) -> Iterator[str]:
    if body is None:
        return
    for media, content in body["content"].items():
        schema = content["schema"]
        if "$ref" in schema:
            yield f"Body ({media}): {type_of(schema)}."
            yield ""
            continue
        yield f"Body ({media}):"
        yield ""
        yield from _fields(schema)


def _answer(response: dict[str, Any]) -> str:
    types = [f"{type_of(content['schema'])} ({media})" if media != "application/json"
             else type_of(content["schema"])
             for media, content in response.get("content", {}).items()]
    description = _cell(_own(response.get("description")))
    return "; ".join(filter(None, [", ".join(types), description]))


def _schema(name: str, schema: dict[str, Any]) -> str:
    lines = [f"### {name} {{: #{_anchor(name)} }}", ""]
    if _own(schema.get("description")):
        lines += [_text(schema["description"]), ""]
    if "enum" in schema:
        lines += ["One of " + ", ".join(f"`{value}`" for value in schema["enum"]) + ".", ""]
    elif "properties" in schema:
        lines += list(_fields(schema))
    return "\n".join(lines)


def _fields(schema: dict[str, Any]) -> Iterator[str]:
    required = set(schema.get("required", []))
    yield "| Field | Type | Description |"
    yield "|---|---|---|"
    for field, spec in schema.get("properties", {}).items():
        optional = "" if field in required else " (optional)"
        yield f"| `{field}`{optional} | {type_of(spec)} | {_cell(spec.get('description', ''))} |"
    yield ""


def type_of(schema: dict[str, Any]) -> str:
    """A JSON schema as a short phrase: a link for a named schema, `a or b`, `list of x`."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix(SCHEMA_PREFIX)
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in schema:
        return " or ".join(type_of(option) for option in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    return f"{kind} ({schema['format']})" if "format" in schema else str(kind)


def _anchor(schema_name: str) -> str:
    return f"schema-{schema_name.lower()}"


def _own(description: str | None) -> str:
    """A description, unless it is one pydantic or FastAPI gave everything alike."""
    return "" if description in INHERITED_DOCS or description is None else description


def _text(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    return _text(text).replace("|", "\\|")


if __name__ == "__main__":
    print(page(openapi_document()), end="")
