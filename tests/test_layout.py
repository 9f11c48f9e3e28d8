"""The package layout holds (docs/architecture.md, "The module map"): no import cycle, the
standard-library core and the harness import nothing above them, services know no HTTP,
and only `muster.rundir` spells the run directory's file names."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from muster.jobenv import MUSTER_PREFIX, TORCHRUN_VARIABLES

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "muster"
# The standard-library core: what the harness may import inside a training process.
CORE = {"muster", "muster.states", "muster.errors", "muster.rundir", "muster.metrics_lines",
        "muster.checkpoint_files", "muster.atomic", "muster.home", "muster.sizes",
        "muster.words", "muster.jobenv"}
HTTP = ("fastapi", "starlette", "uvicorn")
# How run-directory files are named: only `muster.rundir` may spell these.
RUN_DIR_NAMES = re.compile(
    r"rank-\{|rank-\d|attempt-\{|attempt-\d|\.(?:metrics\.jsonl|heartbeat\.json|samples\.json|"
    r"exit\.json|shim\.json|spec\.json|launch\.json|stop-ack\.json|standby-go\.json|"
    r"stalled\.json|shim\.log)|hparams\.json")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(), str(path))
            for path in sorted(PACKAGE.rglob("*.py")) if "alembic" not in path.parts}


def imports(name: str) -> set[str]:
    """Everything `name` imports, anywhere in it (lazy imports too), as module names."""
    known = modules()
    found: set[str] = set()
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(known[name]):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return found


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def muster_imports(name: str) -> set[str]:
    return {m for m in imports(name) if m in modules() and m != name}


def test_there_is_no_import_cycle() -> None:
    graph = {name: muster_imports(name) for name in modules()}
    cycles = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert cycles == []


def test_no_two_packages_import_each_other() -> None:
    """Between packages too (config/ and search/ once did, through different modules)."""
    graph: dict[str, set[str]] = {}
    for name in modules():
        graph.setdefault(_package(name), set()).update(
            _package(m) for m in muster_imports(name) if _package(m) != _package(name))
    cycles = [component for component in _strongly_connected(graph) if len(component) > 1]
    assert cycles == []


def _package(name: str) -> str:
    """`muster.config` for `muster.config.schema`; a top-level module is its own."""
    return ".".join(name.split(".")[:2])


@pytest.mark.parametrize("name", sorted(
    m for m in modules() if m in CORE or m.startswith("muster.harness")))
def test_the_core_and_the_harness_import_only_the_core(name: str) -> None:
    allowed = CORE | {m for m in modules() if m.startswith("muster.harness")}
    assert muster_imports(name) <= allowed, muster_imports(name) - allowed
    if name in CORE:
        third_party = {m.split(".")[0] for m in imports(name)} - {"muster"} - set(
            sys.stdlib_module_names)
        assert third_party == set()


@pytest.mark.parametrize("name", sorted(m for m in modules()
                                        if m.startswith("muster.services")))
def test_services_know_no_http(name: str) -> None:
    used = {m for m in imports(name) if m.split(".")[0] in HTTP or m.startswith(
        "muster.server")}
    assert used == set()


# A shape spelled as a free dict: what `muster.api` declares once, with every key typed.
FREE_DICT = re.compile(r"dict\[\s*str\s*,\s*(typing\.)?Any\s*\]")


def test_views_build_the_api_shapes() -> None:
    """`muster.services.views` builds the shapes of `muster.api` (issue 32), so mypy checks
    every key of every view; a `dict[str, Any]` there is a shape nobody checks."""
    source = (PACKAGE / "services" / "views.py").read_text()
    free = [number for number, line in enumerate(source.splitlines(), start=1)
            if FREE_DICT.search(line)]
    assert free == []


def test_the_client_types_every_answer() -> None:
    """`muster.client.Client` hands out the shapes of `muster.api`, each answer read as its
    shape by one typed helper (issue 32): a `type: ignore` there is an answer nobody typed."""
    source = (PACKAGE / "client.py").read_text()
    ignored = [number for number, line in enumerate(source.splitlines(), start=1)
               if "type: ignore" in line]
    assert ignored == []


def test_only_rundir_spells_the_run_directory() -> None:
    spelled = [(name, text) for name, tree in modules().items() if name != "muster.rundir"
               for text in _code_strings(tree) if RUN_DIR_NAMES.search(text)]
    assert spelled == []


# The models of a stored experiment config (or a block of it) that only its home validates.
STORED_CONFIG_MODELS = {"ExperimentConfig", "SearcherConfig"}


def test_only_the_store_validates_stored_configs() -> None:
    """`muster.store.configs` reads stored configs back (validated once, kept by uuid), and
    `muster.config.loading` validates a submitted one; nobody else validates one."""
    validating = sorted(
        (name, node.lineno) for name, tree in modules().items()
        if not name.startswith("muster.store") and name != "muster.config.loading"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("model_validate")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in STORED_CONFIG_MODELS)
    assert validating == []


def test_only_jobenv_spells_the_job_s_variables() -> None:
    """What muster hands a training process through its environment (its own variables and
    torchrun's) is named once, in `muster.jobenv`; everyone else uses its constants. One
    exception: `muster.startup`, which every Python process of a trial imports first, names
    the three it reads itself (importing jobenv would cost each process ~20 ms);
    tests/test_startup.py holds them equal to jobenv's."""
    names = {node.value.value for node in modules()["muster.jobenv"].body
             if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
             and isinstance(node.value.value, str)
             and node.value.value.startswith(MUSTER_PREFIX)} | TORCHRUN_VARIABLES
    spelled = [(name, text) for name, tree in modules().items()
               if name not in ("muster.jobenv", "muster.startup")
               for text in _code_strings(tree) if text in names]
    assert spelled == []


def _code_strings(tree: ast.Module) -> Iterator[str]:
    """The string constants of a module that are not docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            yield node.value


# Enums that may live outside `muster.states` although another module imports them: none is
# stored, served or compared outside its home and the one module that acts on it.
ENUMS_KEPT_HOME = {
    # The run directory's file names: `muster.rundir` owns that layout (STYLE 14).
    ("muster.rundir", "RankFile"),
    # A replica log's two parts: `muster.launch.logs` owns a log's layout.
    ("muster.launch.logs", "LogPart"),
    # The keys of the authorisation table: callers name one, only `access` reads it.
    ("muster.services.access", "Action"),
    # A decision's answer, read by the module that carries it out: the failure policy's
    # (read by `outcome`), `outcome`'s (by `ending` and `admission`), and a trial's data
    # scan's (by the supervisor).
    ("muster.supervise.policy", "Action"),
    ("muster.supervise.outcome", "Next"),
    ("muster.supervise.launching", "Scan"),
}


def _enum_definitions() -> set[tuple[str, str]]:
    """(module, class) of every Enum subclass defined outside `muster.states`."""
    bases = {"Enum", "StrEnum", "IntEnum", "Flag", "IntFlag"}
    return {(name, node.name) for name, tree in modules().items() if name != "muster.states"
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any((isinstance(base, ast.Name) and base.id in bases)
                    or (isinstance(base, ast.Attribute) and base.attr in bases)
                    for base in node.bases)}


def _names_imported(importer: str, module: str) -> set[str]:
    """What `importer` takes from `module`: names it imports from it, and attributes it reads
    of `module` imported by its last name (`from muster.services import tokens`)."""
    tree = modules()[importer]
    parent, _, leaf = module.rpartition(".")
    found: set[str] = set()
    leaf_bound = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == parent:
            leaf_bound |= any(alias.name == leaf and alias.asname is None for alias in node.names)
    if leaf_bound:
        found.update(node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name) and node.value.id == leaf)
    return found


def test_shared_enums_live_in_states() -> None:
    """An enum another module uses is a word of the shared vocabulary: it lives in
    `muster.states` (issue 32), unless `ENUMS_KEPT_HOME` says why not."""
    shared = sorted((home, enum, importer) for home, enum in _enum_definitions()
                    if (home, enum) not in ENUMS_KEPT_HOME
                    for importer in modules() if importer != home
                    and enum in _names_imported(importer, home))
    assert shared == []
    assert ENUMS_KEPT_HOME - _enum_definitions() == set()  # no excuse outlives its enum


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components
