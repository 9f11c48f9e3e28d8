"""The JSON contract is spelled once: the committed page (docs/reference/json-contract.md)
is what `muster/api.py` says, and every shape and field it names is in the app's
`/openapi.json` for the routes it names, and the other way round."""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from muster import api

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from contract_page import (  # noqa: E402 - the generator lives in scripts/
    PAGE,
    REGENERATE,
    SCHEMA_PREFIX,
    answered_schemas,
    declared_shapes,
    page,
)
from http_reference import openapi_document  # noqa: E402

SECTION = re.compile(r"^## (\w+)\n(.*?)(?=^## |\Z)", re.S | re.M)
FIELD_ROW = re.compile(r"^\| `(\w+)` \|", re.M)
ROUTE = re.compile(r"`((?:GET|POST|PUT|PATCH|DELETE) /[^`]*)`")


@cache
def document() -> dict[str, Any]:
    return openapi_document()


@cache
def committed() -> dict[str, tuple[set[str], set[str]]]:
    """Shape -> (the fields its table names, the routes it says answer with it)."""
    sections = {}
    for name, body in SECTION.findall(PAGE.read_text()):
        answered = next((line for line in body.splitlines()
                         if line.startswith("Answered by ")), "")
        sections[name] = (set(FIELD_ROW.findall(body)), set(ROUTE.findall(answered)))
    return sections


def schemas() -> dict[str, Any]:
    found: dict[str, Any] = document()["components"]["schemas"]
    return found


def test_the_page_is_what_api_py_says() -> None:
    assert PAGE.read_text() == page(document()), (
        f"{PAGE.relative_to(ROOT)} is out of date with src/muster/api.py: run `{REGENERATE}`")


def test_the_page_names_every_shape_and_field_of_api_py() -> None:
    shapes = {typed.__name__: set(get_type_hints(typed)) for typed in declared_shapes()}
    assert {name: fields for name, (fields, _) in committed().items()
            if name in shapes} == shapes
    assert set(shapes) <= set(committed())


@pytest.mark.parametrize("name", sorted(t.__name__ for t in declared_shapes()))
def test_each_shape_has_the_fields_of_its_openapi_schema(name: str) -> None:
    fields, _ = committed()[name]
    assert name in schemas(), f"{name} is on the page but not in /openapi.json"
    assert fields == set(schemas()[name]["properties"])


def test_the_routes_the_page_names_answer_with_that_shape() -> None:
    paths = document()["paths"]
    for name, (_, routes) in committed().items():
        for route in routes:
            method, path = route.split(" ", 1)
            assert name in answered_schemas(paths[path][method.lower()]), (name, route)


def test_every_route_answering_with_a_shape_is_on_the_page() -> None:
    on_page = {(name, route) for name, (_, routes) in committed().items() for route in routes}
    for path, operations in document()["paths"].items():
        for method, operation in operations.items():
            for name in answered_schemas(operation) & set(committed()):
                assert (name, f"{method.upper()} {path}") in on_page


def test_every_schema_a_route_answers_with_is_a_shape_on_the_page() -> None:
    """What the API serves, nested shapes too, is declared in api.py and documented."""
    served = set().union(*(answered_schemas(operation)
                           for operations in document()["paths"].values()
                           for operation in operations.values()))
    reachable = _reachable(served)
    objects = {name for name in reachable if "properties" in schemas()[name]}
    assert objects <= set(committed())
    assert objects <= {typed.__name__ for typed in declared_shapes()}


def _reachable(names: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += re.findall(re.escape(SCHEMA_PREFIX) + r"(\w+)", str(schemas()[name]))
    return seen


def test_the_readme_leaves_the_contract_to_the_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/reference/json-contract.md" in readme
    assert "## JSON contract" not in readme


def test_api_py_is_the_module_the_page_reads() -> None:
    assert api.__name__ == "muster.api"
    assert declared_shapes()
