"""benchmarks/recovery.py's verdict (issue 19, item 8): a baseline that never recovers is
the comparison's result, shown in its table and target, not a crash of the benchmark; muster
never recovering still stops it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load() -> ModuleType:
    """benchmarks/recovery.py under its own name, its siblings importable as run.py has them."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("bench_recovery", BENCHMARKS / "recovery.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_a_baseline_that_never_recovered_is_reported_not_raised() -> None:
    outcome = bench._outcome({"muster": [0.9, 1.0, 1.1], "torchrun": [None, None, None]}, 3)
    (target,) = outcome.targets
    assert target.met and target.measured == "torchrun never recovered (3 of 3 runs); muster 1.00 s"
    rows = {row[0]: row for row in outcome.tables[0].rows}
    assert rows["torchrun"][1:] == ["—", "—", "—", "3"]
    assert rows["muster"][1:] == ["1.00", "0.90", "1.10", "0"]
    assert outcome.data["ratio"] is None and outcome.data["hung"] == {"muster": 0, "torchrun": 3}


def test_runs_that_recovered_are_compared_and_the_others_counted() -> None:
    outcome = bench._outcome({"muster": [1.0, 1.0], "torchrun": [2.5, None]}, 2)
    (target,) = outcome.targets
    assert (target.measured, target.met) == ("0.40", True)
    assert {row[0]: row[4] for row in outcome.tables[0].rows} == {"muster": "0", "torchrun": "1"}


def test_muster_never_recovering_stops_the_benchmark() -> None:
    with pytest.raises(sys.modules["measure"].BenchmarkFailure, match="muster never recovered"):
        bench._outcome({"muster": [None], "torchrun": [2.0]}, 1)
