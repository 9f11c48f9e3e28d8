"""muster.harness.torch: one call saves, one call resumes — weights, optimizer, scheduler,
step, sampler epoch, extra and every rank's RNG, so the run continues exactly."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

pytestmark = pytest.mark.lifecycle  # starts real processes

torch = pytest.importorskip("torch", reason="muster.harness.torch needs PyTorch (the "
                            "'examples' extra)")
np = pytest.importorskip("numpy", reason="the RNG round trip covers NumPy's generator")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import muster.harness as mh  # noqa: E402
import muster.harness.torch as mt  # noqa: E402
from tests.harness.conftest import FIXTURES, MUSTER_VARS  # noqa: E402

RANKS_TIMEOUT = 120


class Trainer:
    """A model with dropout, Adam and a step scheduler, trained on torch's random data."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.5), nn.Linear(12, 2))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.optimizer.zero_grad()
            self.model(torch.randn(5, 6)).pow(2).mean().backward()
            self.optimizer.step()
            self.scheduler.step()

    def save(self, ctx: mh.Context, step: int, **kwargs: Any) -> None:
        mt.save(ctx, step, model=self.model, optimizer=self.optimizer,
                scheduler=self.scheduler, **kwargs)

    def restore(self, ctx: mh.Context) -> mt.Resumed | None:
        return mt.restore(ctx, model=self.model, optimizer=self.optimizer,
                          scheduler=self.scheduler)


def draws() -> list[float]:
    return [random.random(), float(np.random.rand()), torch.rand(1).item()]


def reseed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def assert_same_tensors(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture
def local_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An off-platform run in tmp_path: the harness writes into tmp_path/muster-run."""
    monkeypatch.chdir(tmp_path)
    return tmp_path / "muster-run"


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """torch.distributed initialised in this process as a world of one (gloo)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_importing_the_harness_does_not_import_torch() -> None:
    probe = "import sys, muster.harness; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_restore_without_a_checkpoint_is_none(local_run: Path) -> None:
    trainer = Trainer(0)
    before = trainer.model.state_dict()
    with mh.init() as ctx:
        assert trainer.restore(ctx) is None
    assert_same_tensors(trainer.model.state_dict(), before)


def test_a_restore_continues_exactly_where_the_save_was(local_run: Path) -> None:
    reseed(1)
    original = Trainer(1)
    with mh.init() as ctx:
        original.train(3)
        original.save(ctx, 3, sampler_epoch=2, extra={"note": "x", "ids": torch.arange(4)},
                      metadata={"epoch": 2})
        after_save = draws()
        original.train(4)
        reseed(2)
        resumed_trainer = Trainer(2)
        resumed = resumed_trainer.restore(ctx)
        assert draws() == after_save
        resumed_trainer.train(4)
    assert resumed is not None
    assert (resumed.step, resumed.sampler_epoch, resumed.world_size) == (3, 2, 1)
    assert resumed.extra["note"] == "x" and torch.equal(resumed.extra["ids"], torch.arange(4))
    assert resumed.path.parent == local_run / "checkpoints"
    assert_same_tensors(resumed_trainer.model.state_dict(), original.model.state_dict())
    moments = [s["exp_avg_sq"] for s in resumed_trainer.optimizer.state_dict()["state"].values()]
    expected = [s["exp_avg_sq"] for s in original.optimizer.state_dict()["state"].values()]
    assert len(moments) == 4 and all(map(torch.equal, moments, expected))
    assert resumed_trainer.scheduler.state_dict() == original.scheduler.state_dict()
    assert resumed_trainer.scheduler.last_epoch == 7


def test_the_checkpoint_holds_named_files_and_metadata(local_run: Path) -> None:
    trainer = Trainer(0)
    with mh.init() as ctx:
        trainer.save(ctx, 5, sampler_epoch=1, metadata={"epoch": 1})
        mt.save(ctx, 6, model=trainer.model)
        found = ctx.checkpoint.restore()
    assert found is not None
    metadata = json.loads((found.path / "metadata.json").read_text())
    assert sorted(metadata["files"]) == ["model.pt", "rng.pt"]
    assert metadata["metadata"] == {
        "muster.harness.torch": {"format": 1, "sampler_epoch": None, "world_size": 1}}
    [first] = [p for p in found.path.parent.iterdir() if p.name.startswith("step-000000000005")]
    first_metadata = json.loads((first / "metadata.json").read_text())
    assert sorted(first_metadata["files"]) == [
        "model.pt", "optimizer.pt", "rng.pt", "scheduler.pt"]
    assert first_metadata["metadata"] == {"epoch": 1, "muster.harness.torch": {
        "format": 1, "sampler_epoch": 1, "world_size": 1}}


def test_the_sample_counts_are_on_disk_before_the_checkpoint(local_run: Path) -> None:
    # A resume never redoes the steps before a checkpoint: their counts must not be lost
    # with a rank killed right after it, before the harness's next periodic write.
    with mh.init() as ctx:
        ctx.samples.seen(32, epoch=1)
        mt.save(ctx, 1, model=nn.Linear(1, 1), sampler_epoch=1)
        written = json.loads((local_run / "attempt-1" / "rank-0.samples.json").read_text())
    assert written["epochs"] == {"1": 32}


def test_a_ddp_model_is_saved_unwrapped_and_loads_either_way(
    local_run: Path, one_rank_group: None
) -> None:
    torch.manual_seed(0)
    wrapped = nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
    with mh.init() as ctx:
        mt.save(ctx, 1, model=wrapped)
        plain, rewrapped = nn.Linear(3, 2), nn.parallel.DistributedDataParallel(nn.Linear(3, 2))
        assert mt.restore(ctx, model=plain) is not None
        assert mt.restore(ctx, model=rewrapped) is not None
        found = ctx.checkpoint.restore()
    assert found is not None
    saved = torch.load(found.path / "model.pt", weights_only=True)
    assert sorted(saved) == ["bias", "weight"]
    assert_same_tensors(plain.state_dict(), wrapped.module.state_dict())
    assert_same_tensors(rewrapped.module.state_dict(), wrapped.module.state_dict())


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # torch.compile's imports
def test_a_compiled_model_is_saved_unwrapped(local_run: Path) -> None:
    model = nn.Linear(3, 2)
    with mh.init() as ctx:
        mt.save(ctx, 1, model=torch.compile(model))
        found = ctx.checkpoint.restore()
        plain = nn.Linear(3, 2)
        assert mt.restore(ctx, model=plain) is not None
    assert found is not None
    assert sorted(torch.load(found.path / "model.pt", weights_only=True)) == ["bias", "weight"]
    assert_same_tensors(plain.state_dict(), model.state_dict())


def test_a_sharded_model_is_refused_on_every_rank(local_run: Path, one_rank_group: None) -> None:
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(2, 2))
    fully_shard(model)
    with mh.init() as ctx:
        with pytest.raises(NotImplementedError, match=r"saves whole \(unsharded\) models"):
            mt.save(ctx, 1, model=model)
        with pytest.raises(NotImplementedError, match=r"torch\.distributed\.checkpoint"):
            mt.restore(ctx, model=model)
    assert not (local_run / "checkpoints").exists()


def test_a_sharded_model_saves_and_restores_through_dcp(
    local_run: Path, one_rank_group: None,
) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = fully_shard(nn.Sequential(nn.Linear(4, 4)))
    saved = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    with mh.init() as ctx:
        assert mt.restore_sharded(ctx, {"model": model}) is None
        mt.save_sharded(ctx, 3, {"model": model}, metadata={"epoch": 1})
        mt.save_sharded_async(ctx, 4, {"model": model}).result(timeout=60)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.zero_()
        restored = mt.restore_sharded(ctx, {"model": model})
    assert restored is not None and restored.step == 4
    assert_same_tensors({k: v.full_tensor() for k, v in model.state_dict().items()}, saved)
    assert [p.name[:17] for p in sorted((local_run / "checkpoints").iterdir())] == [
        "step-000000000003", "step-000000000004"]


def test_should_stop_is_the_harness_flag_in_a_world_of_one(
    local_run: Path, one_rank_group: None
) -> None:
    with mh.init() as ctx:
        assert mt.should_stop(ctx) is False
        os.kill(os.getpid(), signal.SIGTERM)
        assert mt.should_stop(ctx) is True


def test_a_different_world_size_restores_weights_and_warns(
    local_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(0)
    with mh.init() as ctx:
        trainer.save(ctx, 4)
        after_save = draws()
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        reseed(5)
        other = Trainer(5)
        with mh.init() as ctx, pytest.warns(RuntimeWarning) as caught:
            resumed = other.restore(ctx)
        assert resumed is not None and (resumed.step, resumed.world_size) == (4, 1)
        assert_same_tensors(other.model.state_dict(), trainer.model.state_dict())
        [warning] = [str(w.message) for w in caught]
        assert f"{resumed.path.name} was saved with world size 1 and is resumed with world " \
               "size 2: the model, optimizer and scheduler were restored and " in warning
        if rank == 0:
            assert "rank 0's RNG state was restored" in warning
            assert draws() == after_save
        else:
            assert "there is no RNG state for rank 1, so its RNG is left as it was" in warning


def test_restore_refuses_what_save_did_not_write(local_run: Path) -> None:
    trainer = Trainer(0)
    with mh.init() as ctx:
        with ctx.checkpoint.save(3) as path:
            torch.save(trainer.model.state_dict(), path / "state.pt")
        with pytest.raises(ValueError, match=r"was not saved by muster\.harness\.torch\.save"):
            trainer.restore(ctx)
        mt.save(ctx, 4, model=trainer.model)
        with pytest.raises(ValueError, match="an optimizer was given"):
            trainer.restore(ctx)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"step": -1}, ValueError, "save: step must be ≥ 0"),
        ({"step": 1.5}, TypeError, "save: step must be an int"),
        ({"sampler_epoch": "1"}, TypeError, "save: sampler_epoch must be an int"),
        ({"metadata": {"muster.harness.torch": 1}}, ValueError, "is reserved for muster"),
        ({"metadata": {"x": object()}}, TypeError, "must be JSON-serialisable"),
    ],
)
def test_save_rejects_bad_arguments_and_leaves_nothing(
    local_run: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    arguments: dict[str, Any] = {"step": 1, **kwargs}
    with mh.init() as ctx, pytest.raises(error, match=match):
        mt.save(ctx, arguments.pop("step"), model=nn.Linear(1, 1), **arguments)
    assert not (local_run / "checkpoints").exists() or not any(
        (local_run / "checkpoints").iterdir())


def run_ranks(where: Path, phase: str, attempt: int, world_size: int = 2) -> list[Any]:
    """Run tests/harness/fixtures/torch_ranks.py as `world_size` ranks; their reports."""
    out = where / "out"
    out.mkdir(exist_ok=True)
    run_dir = where / "run"
    (run_dir / f"attempt-{attempt}").mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if k not in MUSTER_VARS}
    base = {**inherited, "MUSTER_RUN_DIR": str(run_dir), "MUSTER_ATTEMPT": str(attempt),
            "MUSTER_TRIAL_ID": "3", "WORLD_SIZE": str(world_size),
            "RENDEZVOUS": str(where / f"rendezvous-{phase}"), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(FIXTURES / "torch_ranks.py"), phase,
                               str(out)], env={**base, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank in range(world_size)]
    try:
        for rank, process in enumerate(ranks):
            output, _ = process.communicate(timeout=RANKS_TIMEOUT)
            assert process.returncode == 0, f"rank {rank} of {phase}:\n{output.decode()}"
    finally:
        for process in ranks:
            process.kill()
            process.wait()
    return [torch.load(out / f"{phase}-rank{rank}.pt", weights_only=False)
            for rank in range(world_size)]


class TwoRanks(NamedTuple):
    """What each rank of a 2-rank run saw (`first`), then of its resumed attempt."""

    where: Path
    first: list[dict[str, Any]]
    resumed: list[dict[str, Any]]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> TwoRanks:
    where = tmp_path_factory.mktemp("two-ranks")
    first = run_ranks(where, "first", attempt=1)
    return TwoRanks(where, first, run_ranks(where, "resume", attempt=2))


@pytest.mark.timeout(2 * RANKS_TIMEOUT + 30)
def test_each_of_two_ranks_resumes_its_own_rng_and_the_same_training(
    two_ranks: TwoRanks,
) -> None:
    first, resumed = two_ranks.first, two_ranks.resumed
    assert first[0]["draws"] != first[1]["draws"]  # the ranks' generators differ...
    for rank in (0, 1):  # ...and each rank gets its own back
        assert resumed[rank]["draws"] == first[rank]["draws"], rank
        assert resumed[rank]["warnings"] == []
        got = resumed[rank]["resumed"]
        assert (got["step"], got["sampler_epoch"], got["world_size"]) == (3, 1, 2)
        assert got["extra"]["note"] == "hello"
        assert_same_tensors(resumed[rank]["model"], first[rank]["model"])
        assert resumed[rank]["last_epoch"] == first[rank]["last_epoch"] == 6
        for a, b in zip(resumed[rank]["optimizer"]["state"].values(),
                        first[rank]["optimizer"]["state"].values(), strict=True):
            assert_same_tensors(a, b)
    checkpoints = sorted((two_ranks.where / "run" / "checkpoints").iterdir())
    assert [p.name[:17] for p in checkpoints] == ["step-000000000003"]
    assert json.loads((checkpoints[0] / "metadata.json").read_text())["rank"] == 0


@pytest.mark.timeout(2 * RANKS_TIMEOUT + 30)
def test_two_ranks_agree_to_stop_and_share_a_failed_save(two_ranks: TwoRanks) -> None:
    assert [r["stop"] for r in two_ranks.first] == [[False, True], [False, True]]
    rank0_error, rank1_error = (r["save_error"] for r in two_ranks.first)
    assert rank0_error is not None
    assert rank0_error.startswith("Checkpoint for step 99 failed inside its save block")
    assert rank1_error is not None and rank1_error.startswith(
        "rank 0 could not save the checkpoint for step 99: CheckpointError: Checkpoint for "
        "step 99 failed inside its save block")
