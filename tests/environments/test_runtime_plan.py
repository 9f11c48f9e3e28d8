"""What the runtime base holds: the closure rules and the link plan (pure, table-tested)."""

from __future__ import annotations

import pytest

from muster.environments.runtime_plan import (
    DistFacts,
    closure,
    included_distributions,
    link_plan,
)


def dists(*items: DistFacts) -> dict[str, DistFacts]:
    return {d.name: d for d in items}


MUSTER = DistFacts("muster", "0.1.0", (
    "fastapi>=0.110", "pyyaml>=6", "optuna>=4",
    'torch==2.13.0; extra == "examples"', 'pytest>=8; extra == "dev"',
    'moto[server]>=5; extra == "dev"', 'ray==2.60.0; extra == "ray"',
    'unrelated-old; python_version < "3"',
), ("examples", "dev", "ray"))

INSTALLED = dists(
    MUSTER,
    DistFacts("fastapi", "1", ("starlette", "pydantic")),
    DistFacts("starlette", "1", ("anyio",)),
    DistFacts("anyio", "1", ()),
    DistFacts("pydantic", "1", ("typing-extensions",)),
    DistFacts("typing-extensions", "1", ()),
    DistFacts("pyyaml", "6", ()),
    DistFacts("optuna", "4", ("numpy", "sqlalchemy", "tqdm")),
    DistFacts("sqlalchemy", "2", ("typing-extensions",)),
    DistFacts("numpy", "2", ()),
    DistFacts("tqdm", "4", ()),
    DistFacts("torch", "2.13.0", ("typing-extensions", "jinja2", 'pyyaml; extra == "pyyaml"')),
    DistFacts("jinja2", "3", ("markupsafe",)),
    DistFacts("markupsafe", "3", ()),
    DistFacts("pytest", "8", ("pluggy",)),
    DistFacts("pluggy", "1", ()),
    DistFacts("moto", "5", ("boto3", 'flask; extra == "server"'), ("server",)),
    DistFacts("boto3", "1", ()),
    DistFacts("flask", "3", ("jinja2",)),
    DistFacts("ray", "2.60.0", ("msgpack",)),
    DistFacts("msgpack", "1", ()),
    DistFacts("pip", "26", ()),
    DistFacts("unrelated-old", "1", ()),
    DistFacts("rich", "15", ()),  # installed, and nobody's requirement here: kept
)


@pytest.mark.parametrize(("seeds", "expected"), [
    ([("fastapi", "")], {"fastapi", "starlette", "anyio", "pydantic", "typing-extensions"}),
    ([("moto", "")], {"moto", "boto3"}),
    ([("moto", "server")], {"moto", "boto3", "flask", "jinja2", "markupsafe"}),
    ([("Typing_Extensions", "")], {"typing-extensions"}),  # names compare normalized
    ([("not-installed", "")], set()),
    ([("torch", "")], {"torch", "typing-extensions", "jinja2", "markupsafe"}),
])
def test_closure_follows_requirements_markers_and_extras(seeds: list[tuple[str, str]],
                                                        expected: set[str]) -> None:
    assert closure(seeds, INSTALLED) == expected


def test_the_base_leaves_out_musters_own_requirements_but_keeps_what_training_needs() -> None:
    included = set(included_distributions(INSTALLED))
    assert {"fastapi", "starlette", "anyio", "pydantic", "sqlalchemy", "optuna", "pytest",
            "pluggy", "moto", "boto3", "flask", "ray", "msgpack", "muster"}.isdisjoint(included)
    # torch (an examples extra and a training package) with what it needs, though muster's
    # server needs some of it too; numpy, tqdm and pyyaml are training packages.
    assert {"torch", "jinja2", "markupsafe", "typing-extensions", "numpy", "tqdm",
            "pyyaml"} <= included
    # What nobody asked for stays: pip, a package an admin installed, and a requirement of
    # muster's whose marker does not hold here.
    assert {"pip", "rich", "unrelated-old"} <= included


def test_without_musters_own_metadata_nothing_can_be_told_apart() -> None:
    without = {name: d for name, d in INSTALLED.items() if name != "muster"}
    with pytest.raises(LookupError, match="pip install muster"):
        included_distributions(without)


RECORDS = [
    (("torch", "__init__.py"), "torch"),
    (("torch", "lib", "libtorch.so"), "torch"),
    (("torch-2.13.0.dist-info", "RECORD"), "torch"),
    (("fastapi", "__init__.py"), "fastapi"),
    (("typing_extensions.py",), "typing-extensions"),
    (("__pycache__", "typing_extensions.cpython-311.pyc"), "typing-extensions"),
    (("__pycache__", "six.cpython-311.pyc"), "six"),
    (("google", "protobuf", "__init__.py"), "protobuf"),
    (("google", "kept", "__init__.py"), "kept"),
    (("google", "kept", "deep", "x.py"), "kept"),
    (("shared.pth",), "kept"),
    (("shared.pth",), "protobuf"),
]


@pytest.mark.parametrize(("included", "expected"), [
    ({"torch"}, [("torch",), ("torch-2.13.0.dist-info",)]),
    ({"typing-extensions"}, [("__pycache__", "typing_extensions.cpython-311.pyc"),
                             ("typing_extensions.py",)]),
    # A namespace directory shared with a left-out distribution: a real directory holding
    # the included part only; a file two distributions claim is linked.
    ({"kept"}, [("google", "kept"), ("shared.pth",)]),
    ({"kept", "protobuf"}, [("google",), ("shared.pth",)]),
    (set(), []),
])
def test_link_plan_links_whole_entries_and_splits_shared_directories(
        included: set[str], expected: list[tuple[str, ...]]) -> None:
    assert link_plan(RECORDS, included) == expected
