"""examples/digits/ddp.py, the 2-rank DistributedDataParallel example, run for real: under
muster to a verified success, through a SIGKILLed rank to an exact resume, and unchanged
under torchrun.

Each test starts real training processes (PyTorch on gloo, 2 ranks); the timeouts only bound
how long a broken run hangs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from muster import checkpoint_files
from muster.client import pack_context
from muster.services import warm_starts
from muster.services.experiments import create_experiment, describe_trial
from muster.states import TrialState
from muster.store import Attempt, Replica, Trial
from tests.supervise.conftest import Rig, Submitted, TrialView

NEEDS = "the DDP example needs the 'examples' extra (torch, scikit-learn, pillow)"
torch = pytest.importorskip("torch", reason=NEEDS)
pytest.importorskip("sklearn", reason=NEEDS)
pytest.importorskip("PIL", reason=NEEDS)

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
PACED = Path(__file__).resolve().parent / "paced.py"
FILES = 1797  # the digits PNGs prepare_data.py writes: what the manifest counts
RUN_TIMEOUT = 240.0
TORCHRUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits written as PNG files once for the module, by the example's own script."""
    out = tmp_path_factory.mktemp("digits") / "data"
    subprocess.run([sys.executable, str(EXAMPLE / "prepare_data.py"), "--out", str(out)],
                   capture_output=True, timeout=120, check=True)
    return out


def copy_context(tmp_path: Path, digits: Path, scripts: tuple[str, ...]) -> Path:
    """What `muster experiment create` uploads from examples/digits: `scripts` and data."""
    context = tmp_path / "context"
    context.mkdir()
    for name in scripts:
        shutil.copy2(EXAMPLE / name, context / name)
    shutil.copytree(digits, context / "data")
    return context


@pytest.fixture
def context(tmp_path: Path, digits: Path) -> Path:
    return copy_context(tmp_path, digits, ("ddp.py", "train.py"))


def example_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((EXAMPLE / "ddp.yaml").read_text())
    assert config["resources"] == {"replicas": 2}
    return config


def submit(rig: Rig, config: dict[str, Any], context: Path) -> Submitted:
    """`config` with `context` uploaded; a warm start (`searcher.source_*`) is resolved as the
    server resolves it."""
    archive = context.with_name("context.tar.gz")
    archive.write_bytes(pack_context(context))
    experiment_id = create_experiment(rig.store, rig.home, rig.admin,
                                      yaml.safe_dump(config), archive,
                                      sources=warm_starts.resolve_source)
    with rig.store.session_scope() as s:
        trial_id = s.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id))
        return Submitted(experiment_id, trial_id.one())


def run_to_end(rig: Rig, job: Submitted) -> TrialView:
    view = rig.tick_until(
        lambda: TrialState((t := rig.trial(job.trial_id)).state).is_at_rest() and t,
        what=f"trial {job.trial_id} to settle", timeout=RUN_TIMEOUT)
    assert isinstance(view, TrialView)
    return view


def replica_ends(rig: Rig, trial_id: int) -> list[tuple[int, int, str | None, str | None]]:
    """(attempt, rank, reason, signal) of every replica that ran (not a warm standby that
    was never promoted), in order."""
    with rig.store.session_scope() as s:
        rows = s.scalars(select(Replica).join(Attempt).where(
            Attempt.trial_id == trial_id, Attempt.standby.is_(False))
            .order_by(Attempt.number, Replica.rank))
        return [(r.attempt.number, r.rank, r.reason, r.signal) for r in rows]


def checks(rig: Rig, trial_id: int) -> dict[str, dict[str, Any]]:
    trial = describe_trial(rig.store, trial_id)
    return {c["name"]: c for c in trial["verification"]["checks"]}


def records(metrics: Path, kind: str) -> list[dict[str, Any]]:
    """The complete lines of one metrics file of `kind` (a torn last line is skipped)."""
    if not metrics.exists():
        return []
    lines = metrics.read_bytes().split(b"\n")[:-1]  # the last piece is torn or empty
    return [record for record in map(json.loads, lines) if record["kind"] == kind]


def steps(metrics: Path) -> list[int]:
    return [r["step"] for r in records(metrics, "training")]


def saved(checkpoints: Path) -> list[checkpoint_files.Inspection]:
    """The intact checkpoints, lowest step first."""
    return [c for c in checkpoint_files.inspect_all(checkpoints) if c.intact]


def test_the_example_succeeds_under_muster_with_its_samples_verified(
    sqlite_rig: Rig, context: Path
) -> None:
    config = example_config()
    assert config["entrypoint"] == "python ddp.py --data data --epochs 5"
    job = submit(sqlite_rig, config, context)

    view = run_to_end(sqlite_rig, job)

    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    primary, worker = replica_ends(sqlite_rig, job.trial_id)
    assert primary == (1, 0, "OK", None)
    # Rank 1 ends a moment after rank 0; if muster's stop of the others reaches it first,
    # its end is STOPPED (by the signal, or on its own once asked), which is not a failure.
    assert worker[:3] in [(1, 1, "OK"), (1, 1, "STOPPED")]
    found = checks(sqlite_rig, job.trial_id)
    assert all(c["passed"] for c in found.values()), found
    assert found["samples"]["detail"] == f"5 epochs, each within 1.0% of {FILES:,}"
    attempt_dir = view.attempts[0].run_dir
    training = steps(attempt_dir / "rank-0.metrics.jsonl")
    assert training == list(range(1, len(training) + 1))
    assert len(records(attempt_dir / "rank-0.metrics.jsonl", "validation")) == 5
    epochs = [json.loads((attempt_dir / f"rank-{r}.samples.json").read_text())["epochs"]
              for r in (0, 1)]
    assert epochs[0] == epochs[1] and sorted(epochs[0]) == ["1", "2", "3", "4", "5"]
    last = saved(attempt_dir.parent / "checkpoints")[-1]
    assert last.step == training[-1]
    assert last.user_metadata["muster.harness.torch"] == {
        "format": 1, "sampler_epoch": 5, "world_size": 2}


def test_a_sigkilled_rank_restarts_both_from_the_latest_checkpoint(
    sqlite_rig: Rig, context: Path
) -> None:
    config = example_config()
    config["entrypoint"] = [sys.executable, str(PACED), "ddp.py", "--data", "data",
                            "--epochs", "3"]
    config["environment"]["variables"]["MUSTER_TEST_PACE"] = "0.1"  # attempt 1 only
    config["failure_policy"]["stop_grace"] = "2s"
    job = submit(sqlite_rig, config, context)
    first = sqlite_rig.tick_until(
        lambda: (t := sqlite_rig.trial(job.trial_id)).attempts and t.attempts[0].run_dir,
        what="attempt 1 to start", timeout=RUN_TIMEOUT)
    checkpoints = first.parent / "checkpoints"
    epoch_1 = sqlite_rig.tick_until(lambda: saved(checkpoints), what="epoch 1's checkpoint",
                                    timeout=RUN_TIMEOUT)[0]
    sqlite_rig.tick_until(
        lambda: max(steps(first / "rank-0.metrics.jsonl"), default=0) > epoch_1.step,
        what="a step of epoch 2", timeout=RUN_TIMEOUT)

    rank_1 = json.loads((first / "rank-1.shim.json").read_text())["child_pid"]
    os.kill(rank_1, signal.SIGKILL)
    view = run_to_end(sqlite_rig, job)

    assert (view.state, view.reason) == ("SUCCEEDED", "OK"), view.message
    # ddp.yaml keeps a warm standby: attempt 2 was started ahead and waited in init();
    # attempt 2's own standby (3) was not needed.
    assert [(a.number, a.state, a.reason) for a in view.attempts] == [
        (1, "FAILED", "INFRA"), (2, "SUCCEEDED", "OK"), (3, "CANCELED", "standby")]
    killed_at = json.loads((first / "rank-1.exit.json").read_text())["ended_at"]
    for rank in (0, 1):
        started = json.loads((view.attempts[1].run_dir / f"rank-{rank}.shim.json")
                             .read_text())["started_at"]
        assert started < killed_at, "the retry was not the standby started ahead"
    assert (1, 1, "INFRA", "SIGKILL") in replica_ends(sqlite_rig, job.trial_id)
    resumed_from = [c for c in saved(checkpoints) if c.document["attempt"] == 1][-1]
    epoch = resumed_from.user_metadata["epoch"]
    assert epoch in (1, 2)  # the kill came in epoch 2 (epoch 3 only on a very slow machine)
    second = view.attempts[1].run_dir
    assert steps(second / "rank-0.metrics.jsonl")[0] == resumed_from.step + 1
    for rank in (0, 1):
        log = (second / f"rank-{rank}.log").read_text()
        assert (f"rank {rank}: resumed from {resumed_from.name} "
                f"(epoch {epoch}, step {resumed_from.step})") in log
    found = checks(sqlite_rig, job.trial_id)
    assert found["samples"] == {"name": "samples", "passed": True, "status": "passed",
                                "detail": f"3 epochs, each within 1.0% of {FILES:,}"}
    assert all(c["passed"] for c in found.values()), found


def torchrun(cwd: Path, *args: str) -> str:
    """Run the example with torchrun on 2 local ranks in `cwd`; its output. Exit 0 or fail."""
    cwd.mkdir(exist_ok=True)
    command = [str(Path(sys.executable).with_name("torchrun")), "--standalone",
               "--nproc-per-node", "2", str(EXAMPLE / "ddp.py"), *args]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MUSTER_") and k not in ("RANK", "WORLD_SIZE")}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output = process.communicate(timeout=TORCHRUN_TIMEOUT)[0].decode()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, output
    return output


def test_the_example_runs_unchanged_under_torchrun_and_resumes_exactly(
    tmp_path: Path, digits: Path
) -> None:
    interrupted, whole = tmp_path / "interrupted", tmp_path / "whole"
    data = ("--data", str(digits))

    torchrun(interrupted, *data, "--epochs", "2")
    run = interrupted / "muster-run"
    assert len(records(run / "attempt-1" / "rank-0.metrics.jsonl", "validation")) == 2
    samples = [json.loads((run / "attempt-1" / f"rank-{r}.samples.json").read_text())
               for r in (0, 1)]
    per_epoch = [samples[0]["epochs"][e] + samples[1]["epochs"][e] for e in ("1", "2")]
    assert all(abs(n - FILES) <= 0.01 * FILES for n in per_epoch), per_epoch
    after_2 = saved(run / "checkpoints")[-1]
    assert after_2.user_metadata["epoch"] == 2

    resumed = torchrun(interrupted, *data, "--epochs", "3")
    for rank in (0, 1):
        assert (f"rank {rank}: resumed from {after_2.name} (epoch 2, step {after_2.step})"
                in resumed), resumed
    torchrun(whole, *data, "--epochs", "3")

    ends = [saved(where / "muster-run" / "checkpoints")[-1] for where in (interrupted, whole)]
    assert ends[0].step == ends[1].step
    weights = [torch.load(end.path / "model.pt", weights_only=True) for end in ends]
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][name].equal(weights[1][name]) for name in weights[0])

