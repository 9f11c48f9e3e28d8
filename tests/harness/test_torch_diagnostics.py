"""`muster.harness.torch.diagnose`, in this process: what one rank of a local run writes to
its diagnostics file about its samplers, its passes over the data and its gradients."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="muster.harness.torch needs PyTorch (the "
                            "'examples' extra)")

from torch import nn  # noqa: E402
from torch.utils.data import (  # noqa: E402
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    Subset,
    TensorDataset,
)

import muster.harness as mh  # noqa: E402
import muster.harness.diagnostics as harness_diagnostics  # noqa: E402
import muster.harness.torch as mt  # noqa: E402
from muster.diagnostics.bias import Bounds, judge, parse_records  # noqa: E402
from muster.harness.diagnostics import DiagnosticsLog  # noqa: E402
from muster.jobenv import DEFAULT_DIAGNOSTICS_INTERVAL, diagnostics_interval  # noqa: E402
from muster.rundir import RunDir  # noqa: E402


@pytest.fixture
def diagnostics_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An off-platform run in tmp_path; the path of its rank's diagnostics file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MUSTER_DIAGNOSTICS", raising=False)
    return RunDir(tmp_path / "muster-run").attempt(1).rank(0).diagnostics


def records(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if kind is None or r["kind"] == kind]


def numbers(size: int) -> TensorDataset:
    """A data set whose samples are their own indices: a batch shows what was drawn."""
    return TensorDataset(torch.arange(size))


def drawn(loader: DataLoader[Any]) -> list[int]:
    """One pass over `loader`: the samples it yielded, in order."""
    return [int(v) for (batch,) in loader for v in batch.reshape(-1)]


# --- samplers and passes ------------------------------------------------------------------


def test_a_random_loader_records_its_sampler_and_every_pass(diagnostics_file: Path) -> None:
    loader = DataLoader(numbers(20), batch_size=4, shuffle=True)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        epochs = [drawn(loader), drawn(loader)]
    [described] = records(diagnostics_file, "sampler")
    assert described["type"] == "RandomSampler"
    assert (described["random"], described["partitioned"], described["replacement"]) == (
        True, False, False)
    assert described["generator_seed"] is None
    assert described["torch_initial"] == torch.initial_seed()
    assert described["dataset"] == {"type": "TensorDataset", "size": 20}
    passes = records(diagnostics_file, "pass")
    assert [p["pass"] for p in passes] == [0, 1]
    for recorded, yielded in zip(passes, epochs, strict=True):
        assert recorded["sampler"] == described["sampler"]
        assert (recorded["count"], recorded["complete"], recorded["epoch"]) == (20, True, None)
        assert recorded["indices"] == yielded
        assert sorted(recorded["indices"]) == list(range(20))


def test_a_sampler_generator_seed_is_recorded(diagnostics_file: Path) -> None:
    data = numbers(10)
    sampler = RandomSampler(data, generator=torch.Generator().manual_seed(123))
    loader = DataLoader(data, batch_size=5, sampler=sampler)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        drawn(loader)
    [described] = records(diagnostics_file, "sampler")
    assert described["generator_seed"] == 123


def test_a_replacement_sampler_records_its_draws(diagnostics_file: Path) -> None:
    data = numbers(5)
    sampler = RandomSampler(data, replacement=True, num_samples=40,
                            generator=torch.Generator().manual_seed(1))
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        yielded = drawn(loader)
    [described] = records(diagnostics_file, "sampler")
    assert described["replacement"] is True
    [recorded] = records(diagnostics_file, "pass")
    assert (recorded["count"], recorded["indices"]) == (40, yielded)


def test_a_subset_records_the_root_data_set_indices(diagnostics_file: Path) -> None:
    root = numbers(30)
    inner = Subset(root, [29, 3, 17, 8, 11, 25, 0, 14])
    loader = DataLoader(Subset(inner, [7, 1, 2, 5, 4]), batch_size=2, shuffle=True)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        yielded = drawn(loader)
    [described] = records(diagnostics_file, "sampler")
    assert described["dataset"] == {"type": "TensorDataset", "size": 30}
    [recorded] = records(diagnostics_file, "pass")
    assert recorded["indices"] == yielded  # root indices: what the samples are
    assert sorted(recorded["indices"]) == [3, 11, 14, 17, 25]


def test_a_distributed_sampler_records_its_seed_and_epochs(diagnostics_file: Path) -> None:
    data = numbers(20)
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=5, sampler=sampler)
    epochs = []
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append(drawn(loader))
    [described] = records(diagnostics_file, "sampler")
    assert (described["type"], described["partitioned"], described["random"]) == (
        "DistributedSampler", True, True)
    assert described["generator_seed"] == 7
    passes = records(diagnostics_file, "pass")
    assert [(p["epoch"], p["count"]) for p in passes] == [(0, 10), (1, 10)]
    assert [p["indices"] for p in passes] == epochs
    assert epochs[0] != epochs[1]


def test_diagnosing_a_loader_twice_adds_nothing(diagnostics_file: Path) -> None:
    loader = DataLoader(numbers(12), batch_size=4, shuffle=True)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        mt.diagnose(ctx, loader=loader)
        yielded = drawn(loader)
    assert len(records(diagnostics_file, "sampler")) == 1
    [recorded] = records(diagnostics_file, "pass")
    assert (recorded["count"], recorded["indices"]) == (12, yielded)


def test_a_pass_left_early_is_recorded_incomplete(diagnostics_file: Path) -> None:
    loader = DataLoader(numbers(20), batch_size=4, shuffle=True)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        for _ in loader:
            break
        drawn(loader)
    first, second = records(diagnostics_file, "pass")
    assert (first["complete"], first["count"]) == (False, 4)
    assert (second["complete"], second["count"]) == (True, 20)


def test_a_loader_without_batches_records_its_passes(diagnostics_file: Path) -> None:
    loader = DataLoader(numbers(6), batch_size=None, shuffle=True)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        yielded = [int(sample) for (sample,) in loader]
    [recorded] = records(diagnostics_file, "pass")
    assert (recorded["count"], recorded["indices"]) == (6, yielded)


@pytest.mark.lifecycle  # the loader forks its worker processes
def test_a_loader_with_worker_processes_records_its_passes(diagnostics_file: Path) -> None:
    loader = DataLoader(numbers(16), batch_size=4, shuffle=True, num_workers=2)
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        epochs = [drawn(loader), drawn(loader)]
    passes = records(diagnostics_file, "pass")
    assert [(p["pass"], p["count"], p["complete"]) for p in passes] == [(0, 16, True),
                                                                      (1, 16, True)]
    assert [p["indices"] for p in passes] == epochs


class Pairs(Sampler[list[int]]):
    """A custom batch sampler: consecutive pairs, in a random order of its own."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size // 2

    def __iter__(self) -> Iterator[list[int]]:
        for start in torch.randperm(self.size // 2).tolist():
            yield [2 * start, 2 * start + 1]


def test_a_custom_batch_sampler_still_yields_every_batch(diagnostics_file: Path) -> None:
    loader = DataLoader(numbers(8), batch_sampler=Pairs(8))
    with mh.init() as ctx:
        mt.diagnose(ctx, loader=loader)
        assert sorted(drawn(loader)) == list(range(8))
    assert len(records(diagnostics_file, "sampler")) == 1
    assert records(diagnostics_file, "pass") == []  # its passes are not recorded


class Shard(IterableDataset[torch.Tensor]):
    """A stream of ten samples of its own (one rank's shard of a streamed data set)."""

    def __init__(self, start: int) -> None:
        self.start = start

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(self.start, self.start + 10))


def test_ranks_streaming_their_own_shards_do_not_overlap(diagnostics_file: Path) -> None:
    """Two ranks, each reading its own shard of an IterableDataset (recorded here as two
    loaders of one process, then numbered as each rank's own process numbers its first)."""
    loaders = [DataLoader(Shard(0), batch_size=4), DataLoader(Shard(100), batch_size=4)]
    with mh.init() as ctx:
        for loader in loaders:
            mt.diagnose(ctx, loader=loader)
        shards = [[int(v) for batch in loader for v in batch] for loader in loaders]
    assert not set(shards[0]) & set(shards[1])
    written = records(diagnostics_file)
    numbers_ = [r["sampler"] for r in written if r["kind"] == "sampler"]
    ranks = {rank: parse_records([{**r, "sampler": 0} for r in written
                                  if r.get("sampler") == number])
             for rank, number in enumerate(numbers_)}
    overlap = [f for f in judge(ranks, Bounds()) if f.check == "sampler_overlap"]
    assert not any(f.found for f in overlap), overlap


# --- gradients and parameters -------------------------------------------------------------


class Trainer:
    """A linear model trained with SGD on torch's random data; its last step's gradient norm
    and parameters, as the test computes them itself."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(3, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.norms: list[float] = []
        self.hashes: list[list[int]] = []

    def step(self, scale: float = 1.0) -> None:
        self.optimizer.zero_grad()
        loss = self.model(torch.randn(4, 3)).pow(2).mean() * scale
        loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.norms.append(math.sqrt(sum(float(g.pow(2).sum()) for g in grads)))
        self.optimizer.step()
        self.hashes.append([int(p.detach().view(torch.int32).to(torch.int64).sum())
                            for p in self.model.parameters()])


def test_restore_samples_the_model_every_interval_steps(
        diagnostics_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_DIAGNOSTICS", "2")
    trainer = Trainer()
    with mh.init() as ctx:
        assert mt.restore(ctx, model=trainer.model, optimizer=trainer.optimizer) is None
        for _ in range(6):
            trainer.step()
    [described] = records(diagnostics_file, "params")
    assert described == {"kind": "params", "names": ["weight", "bias"], "replicated": False}
    updates = records(diagnostics_file, "update")
    assert [u["update"] for u in updates] == [0, 2, 4]
    for update in updates:
        step = update["update"]
        assert update["grad_norm"] > 0
        assert update["grad_norm"] == pytest.approx(trainer.norms[step], rel=1e-5)
        assert update["grad_finite"] is True
        assert update["hash"] == trainer.hashes[step]  # after the step, bit for bit


def test_the_default_interval_samples_the_first_step(diagnostics_file: Path) -> None:
    trainer = Trainer()
    with mh.init() as ctx:
        mt.diagnose(ctx, model=trainer.model, optimizer=trainer.optimizer)
        for _ in range(DEFAULT_DIAGNOSTICS_INTERVAL + 1):
            trainer.step()
    updates = [u["update"] for u in records(diagnostics_file, "update")]
    assert updates == [0, DEFAULT_DIAGNOSTICS_INTERVAL]


def test_frozen_parameters_are_not_hashed(diagnostics_file: Path) -> None:
    trainer = Trainer()
    trainer.model.bias.requires_grad_(False)
    with mh.init() as ctx:
        mt.diagnose(ctx, model=trainer.model, optimizer=trainer.optimizer)
        trainer.step()
    assert records(diagnostics_file, "params")[0]["names"] == ["weight"]
    [update] = records(diagnostics_file, "update")
    assert update["hash"] == trainer.hashes[0][:1]


def test_restore_then_diagnose_the_same_model_adds_nothing(
        diagnostics_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_DIAGNOSTICS", "1")
    trainer = Trainer()
    with mh.init() as ctx:
        mt.restore(ctx, model=trainer.model, optimizer=trainer.optimizer)
        mt.diagnose(ctx, model=trainer.model, optimizer=trainer.optimizer)
        trainer.step()
        trainer.step()
    assert len(records(diagnostics_file, "params")) == 1
    updates = records(diagnostics_file, "update")
    assert [u["update"] for u in updates] == [0, 1]
    assert updates[1]["grad_norm"] == pytest.approx(trainer.norms[1], rel=1e-5)


def test_a_nan_loss_is_a_non_finite_gradient(diagnostics_file: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_DIAGNOSTICS", "1")
    trainer = Trainer()
    with mh.init() as ctx:
        mt.diagnose(ctx, model=trainer.model, optimizer=trainer.optimizer)
        trainer.step()
        trainer.step(scale=math.nan)
    first, second = records(diagnostics_file, "update")
    assert first["grad_finite"] is True
    assert (second["update"], second["grad_finite"], second["grad_norm"]) == (1, False, None)


def test_steps_a_grad_scaler_skips_are_not_sampled(diagnostics_file: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixed precision: the scaler's first scales overflow, it skips those optimizer steps
    (as every fp16 run does at its start) and halves the scale. The step it finally takes
    applies a finite gradient; the skipped backward passes must not make it non-finite."""
    monkeypatch.setenv("MUSTER_DIAGNOSTICS", "1")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1e38)
    applied = []
    with mh.init() as ctx:
        mt.restore(ctx, model=model, optimizer=optimizer)
        for _ in range(6):
            optimizer.zero_grad()
            scale = scaler.get_scale()
            scaler.scale(model(torch.randn(8, 4)).pow(2).mean() * 100).backward()
            scaler.step(optimizer)
            scaler.update()
            applied.append(scaler.get_scale() == scale)  # not halved: the step was taken
    assert applied == [False] * 5 + [True]
    [update] = records(diagnostics_file, "update")
    assert update["update"] == 0
    assert update["grad_finite"] is True, update


def test_a_second_init_block_records_again(diagnostics_file: Path) -> None:
    """Two runs in one process (a notebook, a sweep over seeds) with the same loader: the
    second run's passes are recorded too."""
    loader = DataLoader(numbers(8), batch_size=4, shuffle=True)
    for _ in range(2):
        with mh.init() as ctx:
            mt.diagnose(ctx, loader=loader)
            drawn(loader)
    assert len(records(diagnostics_file, "pass")) == 2


# --- switched off, misused ----------------------------------------------------------------


def test_off_writes_no_diagnostics_file(diagnostics_file: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_DIAGNOSTICS", "off")
    trainer = Trainer()
    loader = DataLoader(numbers(8), batch_size=4, shuffle=True)
    with mh.init() as ctx:
        mt.restore(ctx, model=trainer.model, optimizer=trainer.optimizer)
        mt.diagnose(ctx, loader=loader)
        drawn(loader)
        trainer.step()
    assert diagnostics_file.parent.is_dir()  # the run wrote its other files
    assert not diagnostics_file.exists()


def test_a_malformed_variable_stops_init(diagnostics_file: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_DIAGNOSTICS", "abc")
    with pytest.raises(ValueError, match="MUSTER_DIAGNOSTICS") as info, mh.init():
        pass
    assert "'abc'" in str(info.value)


def test_a_model_needs_its_optimizer(diagnostics_file: Path) -> None:
    trainer = Trainer()
    with mh.init() as ctx:
        with pytest.raises(TypeError, match="model and optimizer together"):
            mt.diagnose(ctx, model=trainer.model)
        with pytest.raises(TypeError, match="model and optimizer together"):
            mt.diagnose(ctx, optimizer=trainer.optimizer)
        mt.diagnose(ctx)  # nothing to watch: nothing to do
    assert not diagnostics_file.exists()


# --- diagnostics_interval and the bounded log --------------------------------------------


@pytest.mark.parametrize(("environ", "interval"), [
    ({}, DEFAULT_DIAGNOSTICS_INTERVAL),
    ({"MUSTER_DIAGNOSTICS": ""}, DEFAULT_DIAGNOSTICS_INTERVAL),
    ({"MUSTER_DIAGNOSTICS": "  "}, DEFAULT_DIAGNOSTICS_INTERVAL),
    ({"MUSTER_DIAGNOSTICS": "off"}, None),
    ({"MUSTER_DIAGNOSTICS": " off "}, None),
    ({"MUSTER_DIAGNOSTICS": "1"}, 1),
    ({"MUSTER_DIAGNOSTICS": "250"}, 250),
])
def test_diagnostics_interval(environ: dict[str, str], interval: int | None) -> None:
    assert diagnostics_interval(environ) == interval


@pytest.mark.parametrize("raw", ["0", "-3", "abc", "2.5", "OFF", "on", "1e3"])
def test_diagnostics_interval_refuses(raw: str) -> None:
    with pytest.raises(ValueError, match="MUSTER_DIAGNOSTICS must be 'off' or a positive") as info:
        diagnostics_interval({"MUSTER_DIAGNOSTICS": raw})
    assert repr(raw) in str(info.value)


def test_the_log_writes_non_finite_floats_as_null(tmp_path: Path) -> None:
    log = DiagnosticsLog(tmp_path / "d.jsonl", 1)
    log.record({"kind": "update", "values": [math.nan, math.inf, -math.inf, 1.5],
                "nested": {"x": (math.nan,)}})
    log.flush()
    assert json.loads((tmp_path / "d.jsonl").read_text()) == {
        "kind": "update", "values": [None, None, None, 1.5], "nested": {"x": [None]}}


def test_a_log_switched_off_writes_nothing(tmp_path: Path) -> None:
    log = DiagnosticsLog(tmp_path / "d.jsonl", None)
    assert not log.enabled
    log.record({"kind": "update"})
    log.flush()
    assert not (tmp_path / "d.jsonl").exists()


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(harness_diagnostics, "MAX_FILE_BYTES", 200)
    yield 200


def test_the_log_stops_at_its_bound_with_one_warning(tmp_path: Path, small_bound: int) -> None:
    path = tmp_path / "d.jsonl"
    log = DiagnosticsLog(path, 1)
    record = {"kind": "update", "update": 0, "pad": "x" * 40}
    fitting = small_bound // (len(json.dumps(record, separators=(",", ":"))) + 1)
    assert 1 < fitting < 8
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for update in range(8):
            log.record({**record, "update": update})
            log.flush()
    written = records(path)
    assert [r["update"] for r in written] == list(range(fitting))
    assert path.stat().st_size <= small_bound
    [warning] = caught
    assert warning.category is RuntimeWarning
    assert str(path) in str(warning.message)
    assert "later diagnostics are not recorded" in str(warning.message)
    log.record(record)  # full: dropped at once
    log.flush()
    assert len(records(path)) == fitting


def test_the_bound_holds_for_a_batch_of_queued_records(tmp_path: Path, small_bound: int) -> None:
    path = tmp_path / "d.jsonl"
    log = DiagnosticsLog(path, 1)
    with pytest.warns(RuntimeWarning, match="not recorded"):
        for update in range(8):
            log.record({"kind": "update", "update": update, "pad": "x" * 40})
        log.flush()
    assert not path.exists() or path.stat().st_size <= small_bound


def test_a_file_already_there_counts_toward_the_bound(tmp_path: Path, small_bound: int) -> None:
    """A local run appends to ./muster-run/attempt-1's file of the run before it; the file
    stays within its bound ("at most 32 MiB", docs/run-directory.md)."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"x" * (small_bound - 10) + b"\n")
    log = DiagnosticsLog(path, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        log.record({"kind": "update", "update": 0, "pad": "x" * 40})
        log.flush()
    assert path.stat().st_size <= small_bound
