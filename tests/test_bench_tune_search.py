"""benchmarks/tune_search.py's reading of Ray Tune's per-epoch results as the measure's
Reports (pure, no Ray), and its translation of muster's search space into Tune's (with Ray
Tune, skipped without it). The benchmark itself runs real searches (`make
bench-tune-search`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SEARCH_YAML = BENCHMARKS.parent / "examples" / "digits" / "search.yaml"


def _load(name: str, file: str) -> ModuleType:
    """A benchmark module under its own name: its siblings (measure, report, search, ...)
    are imported as top-level modules, as run.py does, from the end of sys.path."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load("bench_tune_search", "tune_search.py")
Report = sys.modules["search"].Report  # the measure's own, which `compare` reads


def row(number: int, epoch: int, at: float, accuracy: float) -> dict[str, object]:
    """One result as Tune hands it to a callback: ours, among Tune's own keys."""
    return {"number": number, "epoch": epoch, "reported_at": at, "val_accuracy": accuracy,
            "training_iteration": epoch, "trial_id": f"t{number}", "done": False}


# Trial 1 stopped by ASHA at epoch 1; trial 0 ran its 3 epochs, its last result handed on
# again when it ended; the two arrive out of time order, as callbacks may see them.
ROWS = [row(0, 1, 1.0, 0.50), row(1, 1, 1.1, 0.40), row(0, 2, 2.0, 0.70),
        row(0, 3, 3.0, 0.90), row(0, 3, 3.0, 0.90) | {"done": True}]


def test_results_become_reports_in_time_order_once_each() -> None:
    reports = bench.reports_from(reversed(ROWS))
    assert reports == [Report(0, 1, 1.0, 0.50), Report(1, 1, 1.1, 0.40),
                       Report(0, 2, 2.0, 0.70), Report(0, 3, 3.0, 0.90)]


def test_a_trial_that_ended_before_max_length_was_stopped_at_its_last_epoch() -> None:
    reports = bench.reports_from(ROWS)
    assert bench.stopped_early(reports, max_length=3) == {1: 1}
    assert bench.stopped_early(reports, max_length=4) == {0: 3, 1: 1}


def test_a_tune_run_is_measured_as_search_py_measures_muster() -> None:
    run = bench.tune_run(ROWS, max_length=3, wall_s=12.5)
    search = sys.modules["search"]
    result = search.compare(1, run.reports, run.reports, run.stop_steps)
    assert run.wall_s == 12.5 and run.starts == {}
    assert result.random.spent == 4  # 3 epochs of trial 0, 1 of trial 1
    assert result.random.reached is not None
    assert result.random.reached.report == Report(0, 3, 3.0, 0.90)


def test_a_saved_run_reads_back_as_it_was() -> None:
    """`--from` shows saved runs: a Run survives its JSON (whose keys are strings)."""
    run = bench.tune_run(ROWS, max_length=3, wall_s=12.5)
    saved = json.loads(json.dumps(dataclasses.asdict(run)))
    assert bench.run_from_json(saved) == run


def test_hyperbands_brackets_are_tunes() -> None:
    """max_t 32, eta 4: s_max = round(2.5) = 2 (to even), so 3 brackets, the most eager
    (16 trials from epoch 2) filled first."""
    assert bench.hyperband_brackets(32, 4) == [(16, 2), (6, 8), (3, 32)]
    assert bench.hyperband_brackets(64, 4) == [(64, 1), (22, 4), (8, 16), (4, 64)]


def test_the_asha_settings_are_musters_adaptive_ashas() -> None:
    base = yaml.safe_load(SEARCH_YAML.read_text())
    config = yaml.safe_dump({**base, "searcher": {
        "name": "adaptive_asha", "metric": "val_accuracy", "smaller_is_better": False,
        "max_trials": 32, "max_length": 32}})
    assert bench.budget({"adaptive_asha": config}) == bench.Budget(
        trials=32, max_length=32, grace_period=1, reduction_factor=4, brackets=3)


def test_musters_space_becomes_tunes_domains() -> None:
    # ray.tune raises ImportError, not ModuleNotFoundError, when only Ray Core is here.
    tune = pytest.importorskip("ray.tune", exc_type=ImportError,
                               reason="no Ray Tune here: `make bench-tune-search` has it")
    domains = bench.tune_space(SEARCH_YAML.read_text())
    assert set(domains) == {"lr", "hidden", "dropout", "batch_size"}
    assert isinstance(domains["lr"].get_sampler(), tune.search.sample.LogUniform)
    assert (domains["lr"].lower, domains["lr"].upper) == pytest.approx((1e-4, 10**-0.5))
    assert domains["hidden"].categories == [8, 16, 32, 64, 128, 256]
    assert (domains["dropout"].lower, domains["dropout"].upper) == (0.0, 0.6)
    assert domains["batch_size"].categories == [16, 32, 64, 128]
