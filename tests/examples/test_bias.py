"""examples/digits/bias.py, the coded-bias example, run for real under muster both ways:
bias.yaml (every rank's WeightedRandomSampler seeded alike) ends SUSPECT naming the overlap,
the seed and the fix; bias-fixed.yaml (a generator per rank) passes every diagnostic.

Both trials run at once on one rig (2 ranks each, PyTorch on gloo); the timeout only bounds
how long a broken run hangs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from muster.diagnostics.bias import CHECKS
from muster.services.diagnostics import trial_diagnostics
from tests.examples.test_ddp import (
    EXAMPLE,
    NEEDS,
    checks,
    copy_context,
    digits,
    run_to_end,
    submit,
)
from tests.supervise.conftest import Rig

pytest.importorskip("torch", reason=NEEDS)
pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

__all__ = ["digits"]  # the module's PNG files, made once


def _config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((EXAMPLE / name).read_text())
    config["failure_policy"]["heartbeat_timeout"] = "200s"
    return config


def test_the_biased_sampler_is_suspect_and_the_fixed_one_passes_every_diagnostic(
    sqlite_rig: Rig, tmp_path: Path, digits: Path
) -> None:
    context = copy_context(tmp_path, digits, ("bias.py", "train.py"))
    biased = submit(sqlite_rig, _config("bias.yaml"), context)
    fixed = submit(sqlite_rig, _config("bias-fixed.yaml"), context)

    fixed_view, biased_view = run_to_end(sqlite_rig, fixed), run_to_end(sqlite_rig, biased)

    assert fixed_view.state == "SUCCEEDED", fixed_view.message
    found = checks(sqlite_rig, fixed.trial_id)
    assert {f"diagnostics.{name}" for name in CHECKS} <= set(found), sorted(found)
    assert all(c["passed"] and not c["detail"].startswith("warning")
               for c in found.values()), found
    assert found["samples"]["passed"]

    assert biased_view.state == "SUSPECT", biased_view.message
    found = checks(sqlite_rig, biased.trial_id)
    failed = sorted(name for name, c in found.items() if not c["passed"])
    assert failed == ["diagnostics.rank_seeds", "diagnostics.sampler_overlap"], found
    overlap = found["diagnostics.sampler_overlap"]["detail"]
    assert "ranks 0 and 1 drew 100% the same samples from their WeightedRandomSampler" in overlap
    assert "generator=torch.Generator().manual_seed(seed + rank)" in overlap
    assert "the same seed 0" in found["diagnostics.rank_seeds"]["detail"]
    assert "sampler_overlap" in (biased_view.message or "")

    # The series behind the checks (GET /trials/{id}/diagnostics), judged again from the files.
    shown = trial_diagnostics(sqlite_rig.store, biased.trial_id)
    assert (shown["attempt"], shown["ranks"]) == (1, [0, 1])
    assert [point[1] for point in shown["series"]["sampler_overlap"]] == [1.0] * 4
    found_now = {f["check"]: f for f in shown["findings"]}
    assert found_now["diagnostics.sampler_overlap"]["found"]
    assert found_now["diagnostics.sampler_overlap"]["mode"] == "suspect"
    shown = trial_diagnostics(sqlite_rig.store, fixed.trial_id)
    assert all(point[1] < 0.05 for point in shown["series"]["sampler_overlap"]), shown
    assert len(shown["series"]["grad_norm_spread"]) >= 3
    assert not any(f["found"] for f in shown["findings"])
