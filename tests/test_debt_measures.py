"""scripts/debt_measures.py counts what issue 32 measures, on a tree made for the test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).parents[1] / "scripts" / "debt_measures.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("debt_measures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["debt_measures"] = module
    spec.loader.exec_module(module)
    return module


def _write(root: Path, name: str, text: str) -> None:
    path = root / "src" / "muster" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_each_measure_counts_what_it_names(tmp_path: Path) -> None:
    _write(tmp_path, "client.py", "x: dict[str, Any] = {}  # type: ignore[misc]\n")
    _write(tmp_path, "services/views.py", "def f() -> dict[str, Any]: ...\n")
    _write(tmp_path, "launch/local.py", "on_cluster = False\n")
    _write(tmp_path, "supervise/admission.py",
           "if launcher.on_cluster:\n    c = ExperimentConfig.model_validate(x)\n")
    _write(tmp_path, "store/configs.py", "c = ExperimentConfig.model_validate(x)\n")
    _write(tmp_path, "states.py", "class TrialState(str, Enum):\n    A = 'A'\n")
    _write(tmp_path, "planner.py", "class Kind(str, Enum):\n    A = 'A'\ny = Kind.A.value\n")
    _write(tmp_path, "api.py", "Hparams = dict[str, Any]\nh: Hparams\ng: Hparams\n")
    found = _script().measures(tmp_path)
    assert found["dict[str, Any] in src"] == 3
    assert (found["free-JSON aliases of dict[str, Any]"], found["uses of those aliases"]) == (1, 2)
    assert (found["type: ignore in src"], found["type: ignore in client.py"]) == (1, 1)
    assert found["dict[str, Any] in services/views.py"] == 1
    assert found["on_cluster readers outside launch/"] == 1
    assert found["config validations outside store/"] == 1
    assert found["enums defined outside states.py"] == 1
    assert found[".value reads in src"] == 1
    assert found["modules in src"] == 8
