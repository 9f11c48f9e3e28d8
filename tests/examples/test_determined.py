"""Determined Core API scripts under muster, with Determined's own configs: muster's
examples/determined-core-api (a random search) and the stages of Determined's Core API
tutorial (tests/fixtures/determined_tutorial, changed only for generated data and CPU
collectives), each submitted as its Determined config is written: translated, run with
`compat: determined`, and held to muster's verdict.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster.client import pack_context
from muster.services.experiments import (
    activate_experiment,
    create_experiment,
    describe_trial,
    pause_experiment,
)
from muster.states import TrialState
from muster.store import Metric, Trial
from tests.examples.framework_runs import FAULTS, first_checkpoint, log_of, until
from tests.examples.test_ddp import records, run_to_end, saved, submit
from tests.supervise.conftest import Rig, Submitted, TrialView

pytest.importorskip("torch", reason="the Core API examples need the 'examples' extra")

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "determined-core-api"
TUTORIAL = ROOT / "tests" / "fixtures" / "determined_tutorial"
RUN_TIMEOUT = 200.0


def submit_as_written(rig: Rig, folder: Path, config: str, tmp_path: Path) -> list[int]:
    """Run an experiment of `folder` (its context) with its Determined config `config` as
    it is, to its end; its trials' ids."""
    context = tmp_path / "context"
    shutil.copytree(folder, context, ignore=shutil.ignore_patterns("__pycache__"))
    return run_experiment(rig, context, (folder / config).read_text())


def run_experiment(rig: Rig, context: Path, config_text: str, trials: int = 1) -> list[int]:
    """Run an experiment of `context` with `config_text` until it ended, or made `trials`
    trials that are all at rest (a SUSPECT one waits for a review); its trials' ids."""
    archive = context.with_name("context.tar.gz")
    archive.write_bytes(pack_context(context))
    experiment = create_experiment(rig.store, rig.home, rig.admin, config_text, archive)

    def made() -> list[int]:
        with rig.store.session_scope() as s:
            return list(s.scalars(select(Trial.id).where(Trial.experiment_id == experiment)
                                  .order_by(Trial.id)))

    def settled() -> bool:
        ids = made()
        return rig.experiment_state(experiment).is_terminal() or (len(ids) >= trials and all(
            TrialState(rig.trial(i).state).is_at_rest() for i in ids))

    rig.tick_until(settled, what=f"experiment {experiment} to settle", timeout=RUN_TIMEOUT)
    return made()


def submit_drawn(rig: Rig, config: dict[str, Any], context: Path) -> Submitted:
    """Submit `config`, whose one trial a search draws (Determined's `single` over ranges is
    muster's random search of one), and wait for that trial to be drawn."""
    archive = context.with_name("context.tar.gz")
    archive.write_bytes(pack_context(context))
    experiment = create_experiment(rig.store, rig.home, rig.admin, yaml.safe_dump(config),
                                   archive)

    def drawn() -> int | None:
        with rig.store.session_scope() as s:
            return s.scalars(select(Trial.id).where(Trial.experiment_id == experiment)).first()

    return Submitted(experiment, rig.tick_until(drawn, what="the trial to be drawn"))


def succeeded(rig: Rig, trial_id: int, verified: bool = True) -> TrialView:
    view = rig.trial(trial_id)
    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    trial = describe_trial(rig.store, trial_id)
    assert trial["integration"] == "determined"
    assert trial["verified"] is verified, trial["verification"]
    return view


def test_the_core_api_example_runs_its_determined_search_verified(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    trials = submit_as_written(sqlite_rig, EXAMPLE, "det.yaml", tmp_path)

    assert len(trials) == 2
    for trial_id in trials:
        view = succeeded(sqlite_rig, trial_id)
        metrics = view.attempts[0].run_dir / "rank-0.metrics.jsonl"
        assert len(records(metrics, "validation")) == 5  # an epoch each


def test_a_determined_grid_config_runs_each_point_once_verified(sqlite_rig: Rig,
                                                                tmp_path: Path) -> None:
    trials = submit_as_written(sqlite_rig, EXAMPLE, "grid.yaml", tmp_path)

    assert len(trials) == 2
    for trial_id in trials:
        succeeded(sqlite_rig, trial_id)
    rates = sorted(describe_trial(sqlite_rig.store, t)["hparams"]["learning_rate"]
                   for t in trials)
    assert rates == pytest.approx([0.01, 0.1])  # 10**-2 and 10**-1: the log range's 2 points


def test_the_tutorials_distributed_stage_resumes_its_four_ranks_after_one_is_sigkilled(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    """Stage 4 (distributed.yaml: `slots_per_trial: 4` under
    `determined.launch.torch_distributed`, the script run by faults.py for its pace; the
    `muster:` block gives it one retry): rank 2 SIGKILLed after the first checkpoint ends
    the attempt INFRA; the next attempt's four ranks resume from the latest checkpoint, and
    the trial succeeds (not verified: the config plans no length, and the verdict says so)."""
    rig = sqlite_rig
    context = tmp_path / "context"
    shutil.copytree(TUTORIAL, context, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(FAULTS, context / FAULTS.name)
    config = yaml.safe_load((TUTORIAL / "distributed.yaml").read_text())
    config["entrypoint"] = config["entrypoint"].replace(
        "python3 model_def_distributed.py", f"python3 {FAULTS.name} model_def_distributed.py")
    config["muster"] = {"environment": {"variables": {"TEST_PACE": "0.3"}},
                        "failure_policy": {"trial_retries": 1}}
    job = submit_drawn(rig, config, context)
    first, checkpoints = first_checkpoint(rig, job)
    killed = saved(checkpoints)[-1]
    os.kill(json.loads((first / "rank-2.shim.json").read_text())["child_pid"], signal.SIGKILL)
    view = run_to_end(rig, job)

    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    assert [a.reason for a in view.attempts] == ["INFRA", "OK"]
    second = view.attempts[1].run_dir
    assert sorted(p.name for p in second.glob("rank-*.heartbeat.json")) == [
        f"rank-{r}.heartbeat.json" for r in range(4)]
    resumed = records(second / "rank-0.metrics.jsonl", "validation")
    assert resumed and resumed[0]["step"] > killed.step  # not from the first epoch
    trial = describe_trial(rig.store, job.trial_id)
    assert (trial["integration"], trial["verified"]) == ("determined", False)
    verification = trial["verification"]
    assert str(verification["why_not_verified"]).startswith("completed: no planned length")
    assert all(c["passed"] for c in verification["checks"] if c["status"] != "not_run")


def test_the_tutorials_metrics_stage_charts_what_it_reports(sqlite_rig: Rig,
                                                           tmp_path: Path) -> None:
    """Stage 1 (metrics.yaml as written): the script's training and validation reports are
    the trial's metrics, stored for the charts. This stage saves no checkpoint (the next one
    adds them), and an exit 0 with nothing saved is never a success in muster: the trial is
    SUSPECT for a person to review, with that the one failed check."""
    (trial_id,) = submit_as_written(sqlite_rig, TUTORIAL, "metrics.yaml", tmp_path)

    view = sqlite_rig.trial(trial_id)
    assert view.state == "SUSPECT", view.message
    trial = describe_trial(sqlite_rig.store, trial_id)
    assert trial["integration"] == "determined"
    failed = [c for c in trial["verification"]["checks"] if c["status"] == "failed"]
    assert [(c["name"], c["detail"]) for c in failed] == [
        ("checkpoint", "no checkpoint was saved (checkpoints/ is empty)")]
    attempt = view.attempts[0].run_dir
    validation = records(attempt / "rank-0.metrics.jsonl", "validation")
    # An epoch each (the script's default --epochs 14) at its steps_completed; the stand-in
    # data's 2 batches an epoch never reach its --log-interval 10 for a training report.
    assert [r["step"] for r in validation] == [2 * epoch for epoch in range(1, 15)]
    assert all(math.isfinite(r["metrics"]["test_loss"]) for r in validation)
    with sqlite_rig.store.session_scope() as s:
        stored = s.scalars(select(Metric.step).where(Metric.trial_id == trial_id,
                                                     Metric.kind == "validation")).all()
    assert sorted(stored) == [r["step"] for r in validation]  # what the charts draw


def test_the_tutorials_adaptive_search_counts_its_rungs_in_epochs(sqlite_rig: Rig,
                                                                 tmp_path: Path) -> None:
    """Stage 3 (adaptive.yaml as written, with a `muster:` block for fewer trials than its
    50): adaptive_asha with `max_time: 20, time_metric: epochs` judges each trial at the
    `epochs` it reports with test_loss; a trial that trains all 20 is verified complete by
    its epochs, one stopped early stopped at a rung counted in epochs."""
    context = tmp_path / "context"
    shutil.copytree(TUTORIAL, context, ignore=shutil.ignore_patterns("__pycache__"))
    config = yaml.safe_load((TUTORIAL / "adaptive.yaml").read_text())
    config["muster"] = {"searcher": {"max_trials": 4, "max_concurrent_trials": 2}}

    trials = run_experiment(sqlite_rig, context, yaml.safe_dump(config), trials=4)

    assert len(trials) == 4
    for trial_id in trials:
        trial = describe_trial(sqlite_rig.store, trial_id)
        assert (trial["state"], trial["integration"]) == ("SUCCEEDED", "determined")
        checks = {c["name"]: c for c in trial["verification"]["checks"]}
        epochs = [r["metrics"]["epochs"] for a in sqlite_rig.trial(trial_id).attempts
                  for r in records(a.run_dir / "rank-0.metrics.jsonl", "validation")]
        if trial["early_stopped"]:
            assert trial["early_stop"]["time"] in epochs and max(epochs) < 20
            assert checks["completed"]["detail"].startswith("stopped early by the searcher")
        else:
            assert trial["verified"] is True, trial["verification"]
            assert epochs == list(range(1, 21))
            assert checks["completed"]["detail"] == (
                "reached epoch 20 of 20 (searcher.max_length)")


def test_the_tutorials_checkpoint_stage_resumes_after_a_pause_and_a_sigkill(
        sqlite_rig: Rig, tmp_path: Path) -> None:
    """Stage 2 (checkpoints.yaml as written, run under faults.py, whose pace and one retry
    the `muster:` block sets): paused after its first checkpoint, activated, its resumed attempt
    SIGKILLed; each attempt goes on from the latest checkpoint, and the trial succeeds."""
    rig = sqlite_rig
    context = tmp_path / "context"
    shutil.copytree(TUTORIAL, context, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(FAULTS, context / FAULTS.name)
    config = yaml.safe_load((TUTORIAL / "checkpoints.yaml").read_text())
    config["entrypoint"] = f"python3 {FAULTS.name} model_def_checkpoints.py"
    # Its `max_restarts: 0` would fail the trial at the SIGKILL, as on Determined: one retry.
    config["muster"] = {"environment": {"variables": {"TEST_PACE": "0.25",
                                                      "TEST_PACE_ATTEMPTS": "1,2"}},
                        "failure_policy": {"trial_retries": 1}}
    job = submit(rig, config, context)
    _, checkpoints = first_checkpoint(rig, job)

    pause_experiment(rig.store, rig.admin, job.experiment_id)
    rig.until_trial(job, TrialState.PAUSED)
    paused = saved(checkpoints)[-1]
    activate_experiment(rig.store, rig.admin, job.experiment_id)
    second = until(rig, job, lambda: len(a := rig.trial(job.trial_id).attempts) > 1
                   and a[1].run_dir, "attempt 2")
    until(rig, job, lambda: any(c.document["attempt"] == 2 for c in saved(checkpoints)),
          "attempt 2's first checkpoint")
    os.kill(json.loads((second / "rank-0.shim.json").read_text())["child_pid"], signal.SIGKILL)
    view = run_to_end(rig, job)

    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    assert [a.reason for a in view.attempts][1:] == ["INFRA", "OK"]
    # Each attempt began where the last checkpoint left it, not from the first epoch.
    resumed = records(second / "rank-0.metrics.jsonl", "validation")
    assert resumed and resumed[0]["step"] > paused.step
    third = records(view.attempts[2].run_dir / "rank-0.metrics.jsonl", "validation")
    assert third and third[0]["step"] > resumed[0]["step"]
    assert describe_trial(rig.store, job.trial_id)["integration"] == "determined"
    assert "Traceback" not in log_of(view.attempts[2].run_dir)


def test_a_core_api_crash_the_script_swallows_is_suspect(sqlite_rig: Rig,
                                                         tmp_path: Path) -> None:
    """A trial of the example's search (one: the `muster:` block says so) with optimizer step
    40 crashing and the crash swallowed (exit 0): it stopped short of its max_length, so it
    is SUSPECT."""
    context = tmp_path / "context"
    shutil.copytree(EXAMPLE, context, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(FAULTS, context / FAULTS.name)
    config = yaml.safe_load((EXAMPLE / "det.yaml").read_text())
    config["entrypoint"] = f"python3 {FAULTS.name} {config['entrypoint'].split(' ', 1)[1]}"
    config["muster"] = {"environment": {"variables": {"TEST_CRASH_AT": "40"}},
                        "searcher": {"max_trials": 1}}

    trials = run_experiment(sqlite_rig, context, yaml.safe_dump(config))

    assert len(trials) == 1
    for trial_id in trials:
        view = sqlite_rig.trial(trial_id)
        assert view.state == "SUSPECT", view.message
        assert "caught: injected crash at optimizer step 40" in log_of(view.attempts[0].run_dir)
        checks = {c["name"]: c for c in describe_trial(sqlite_rig.store, trial_id)
                  ["verification"]["checks"]}
        assert checks["completed"]["detail"].startswith("stopped at ")
        assert "searcher.max_length" in checks["completed"]["detail"]
