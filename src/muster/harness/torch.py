"""Resume a PyTorch training loop exactly where it stopped: `save`, `restore`, `should_stop`.

```python
import muster.harness as mh
import muster.harness.torch as mt

with mh.init() as ctx:
    model = DistributedDataParallel(Net())              # a plain module works the same
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    step, first_epoch = 0, 0
    if resumed := mt.restore(ctx, model=model, optimizer=optimizer, scheduler=scheduler):
        step, first_epoch = resumed.step, resumed.sampler_epoch + 1
    mt.diagnose(ctx, loader=loader)                     # what each rank's sampler draws
    for epoch in range(first_epoch, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...
            step += 1
        scheduler.step()
        mt.save(ctx, step, model=model, optimizer=optimizer, scheduler=scheduler,
                sampler_epoch=epoch)                     # on every rank; rank 0 writes
        if mt.should_stop(ctx):                         # any rank asked: all leave together
            break
```

A checkpoint holds the model's, optimizer's and scheduler's `state_dict`s, the global step,
the sampler epoch, `extra`, and the random number generators of every rank (Python's
`random`, NumPy's global generator when NumPy is installed, torch's CPU generator and every
CUDA device's): after `restore`, each rank draws the same numbers it would have drawn had
the run never stopped, so dropout, `DataLoader` shuffling and augmentation continue as
they were. Files in the checkpoint directory (each a `torch.save`):

    model.pt       the model's state_dict, unwrapped from DDP, DataParallel, torch.compile
    optimizer.pt   optimizer.state_dict(), when an optimizer was given
    scheduler.pt   scheduler.state_dict(), when a scheduler was given
    extra.pt       `extra`, when given
    rng.pt         {"world_size": W, "ranks": {rank: {"python", "numpy", "torch", "cuda"}}}

and, in metadata.json's "metadata", `{"muster.harness.torch": {"format": 1,
"sampler_epoch": e, "world_size": W}}` beside the caller's own `metadata`.

When torch.distributed is initialized, `save`, `restore` and `should_stop` are collectives
(like Lightning's `trainer.save_checkpoint`): every rank calls them, in the same order.
Importing this module imports torch; `import muster.harness` does not.

**Sharded state** (FSDP, or any state too big for one rank) goes through
torch.distributed.checkpoint instead: every rank writes its own shard into one checkpoint
(`ctx.checkpoint.save_sharded`), published once every rank's is written.

```python
state = {"model": model, "optimizer": optimizer}        # Stateful objects, or state_dicts
restored = mt.restore_sharded(ctx, state)               # dcp.load in place; None: fresh
...
mt.save_sharded(ctx, step, state)                       # dcp.save, on every rank
pending = mt.save_sharded_async(ctx, step, state)       # dcp.async_save; the loop goes on
```

**Diagnostics** (on unless the config says `diagnostics: {record: false}`): `restore`
starts sampling the model's local gradient norm and parameter hashes every
`diagnostics.interval` optimizer steps, and `diagnose(ctx, loader=...)` records what each
rank's sampler draws (`muster.harness.torch_diagnostics`). muster compares the ranks when
the trial ends: ranks that drew the same samples, samplers seeded alike on every rank,
a rank whose gradients stand out, replicas that drifted apart, a non-finite gradient on
any rank, uneven shards (docs/diagnostics.md).
"""

from __future__ import annotations

import functools
import importlib
import json
import random
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, NotRequired, Protocol, TypedDict, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.serialization import MAP_LOCATION

from muster.checkpoint_files import Metadata
from muster.harness.arguments import check_count
from muster.harness.background import run_warning_on_oserror
from muster.harness.checkpoints import Checkpoint, CheckpointError
from muster.harness.context import Context
from muster.harness.sharded import PendingSave, Waitable
from muster.harness.torch_diagnostics import attach_loader, attach_model

__all__ = ["Resumed", "Stateful", "diagnose", "restore", "restore_sharded", "save",
           "save_sharded", "save_sharded_async", "should_stop"]

FORMAT = 1
METADATA_KEY = "muster.harness.torch"
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
EXTRA_FILE = "extra.pt"
RNG_FILE = "rng.pt"


class SavedBy(TypedDict):
    """What `save` records in the checkpoint's metadata, under `METADATA_KEY`."""

    format: int  # `FORMAT`
    sampler_epoch: int | None
    world_size: int  # how many ranks the saving run had


class RngState(TypedDict):
    """One rank's random number generators, as `rng.pt` holds them."""

    python: tuple[Any, ...]  # random.getstate()
    torch: torch.Tensor
    # numpy's (kind, keys as an int64 tensor, position, has_gauss, cached_gaussian), when
    # numpy is installed
    numpy: NotRequired[tuple[str, torch.Tensor, int, int, float]]
    cuda: NotRequired[list[torch.Tensor]]  # one per device, when CUDA is available


class SavedRng(TypedDict):
    """`rng.pt`: every rank's RNG state on rank 0."""

    world_size: int
    ranks: dict[int, RngState]


class Stateful(Protocol):
    """What `save` and `restore` take as an optimizer or scheduler: a state_dict pair."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


class Resumed(NamedTuple):
    """What `restore` brought back, and where the loop continues."""

    step: int  # the step given to save(): the next step is step + 1
    sampler_epoch: int | None  # the sampler_epoch given to save()
    extra: Any  # the extra given to save(), or None
    path: Path  # the checkpoint directory
    world_size: int  # how many ranks the saving run had
    # The experiment's warm start, another trial's checkpoint (`Checkpoint.warm_start`):
    # its step is that trial's, so a loop that starts over counts from 0.
    warm_start: bool = False


def save(
    ctx: Context,
    step: int,
    *,
    model: nn.Module,
    optimizer: Stateful | None = None,
    scheduler: Stateful | None = None,
    sampler_epoch: int | None = None,
    extra: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Save everything a resume needs as one checkpoint of `step` (an atomic, hashed save).

    Call it on every rank when torch.distributed is initialized: each rank writes its
    sample counts (`ctx.samples`) and contributes its RNG state, rank 0 writes the
    checkpoint, and every rank returns once it is published (or raises if it was not).
    Without torch.distributed, rank 0 saves and other ranks only write their sample counts.

    Args:
        step: the global step just completed; `restore` returns it, the loop goes on at
            step + 1.
        model: the model, plain or wrapped in DDP, DataParallel or torch.compile; its
            unwrapped `state_dict` is saved, so it loads into an unwrapped model too.
        optimizer, scheduler: saved through their `state_dict()` when given.
        sampler_epoch: the epoch last given to `DistributedSampler.set_epoch`; with a
            checkpoint at the end of an epoch, the loop goes on at sampler_epoch + 1.
        extra: anything else to bring back (a GradScaler's state_dict, the best metric so
            far): what `torch.load(weights_only=True)` reads back — tensors, numbers,
            strings, and lists, tuples and dicts of them.
        metadata: JSON-serialisable facts shown with the checkpoint (metadata.json).

    Raises:
        CheckpointError: the checkpoint could not be written; nothing of it was left.
        TypeError, ValueError: an argument is malformed (raised on every rank).
        NotImplementedError: `model` is sharded with FSDP.
    """
    step = check_count(step, "save: step")
    if sampler_epoch is not None:
        sampler_epoch = check_count(sampler_epoch, "save: sampler_epoch")
    document = _checked_metadata(metadata)
    weights = _unwrapped(model)
    rank, world_size = _rank_and_world_size(ctx)
    document[METADATA_KEY] = SavedBy(format=FORMAT, sampler_epoch=sampler_epoch,
                                     world_size=world_size)
    # A checkpoint says the steps before it are done; a resume never redoes them. So their
    # sample counts must be on disk, on every rank, before it exists (the gather below
    # orders these writes before rank 0's save): a rank killed just after the checkpoint
    # would otherwise leave its epoch short of samples for good.
    run_warning_on_oserror(f"writing {ctx.samples.path}", ctx.samples.flush)
    rng = SavedRng(world_size=world_size, ranks=_gathered_rng_states(rank, world_size))
    try:
        if rank == 0:
            _write(ctx, step, document, weights, optimizer, scheduler, extra, rng)
    except Exception as exc:
        _share_outcome(f"{type(exc).__name__}: {exc}", rank, step)
        raise
    _share_outcome(None, rank, step)


def _write(
    ctx: Context, step: int, document: Metadata, weights: nn.Module,
    optimizer: Stateful | None, scheduler: Stateful | None, extra: Any, rng: SavedRng,
) -> None:
    with ctx.checkpoint.save(step, metadata=document) as path:
        torch.save(weights.state_dict(), path / MODEL_FILE)
        _save_if_given(optimizer, path / OPTIMIZER_FILE)
        _save_if_given(scheduler, path / SCHEDULER_FILE)
        if extra is not None:
            torch.save(extra, path / EXTRA_FILE)
        torch.save(rng, path / RNG_FILE)


def restore(
    ctx: Context,
    *,
    model: nn.Module,
    optimizer: Stateful | None = None,
    scheduler: Stateful | None = None,
    map_location: MAP_LOCATION = "cpu",
    strict: bool = True,
) -> Resumed | None:
    """Load the latest intact checkpoint into `model`, `optimizer`, `scheduler` and the RNGs.

    Call it on every rank (a collective when torch.distributed is initialized): every rank
    loads the same checkpoint, and each gets back its own RNG state. When the checkpoint
    was saved by a different number of ranks, the model, optimizer and scheduler are still
    restored; a RuntimeWarning says so, and a rank that did not exist then keeps its RNG
    as it is.

    Args:
        model: the model to load into, plain or wrapped (see `save`).
        optimizer, scheduler: loaded when given; the checkpoint must then hold them.
        map_location: where tensors are loaded, as for `torch.load` (RNG states always
            load on the CPU).
        strict: as for `Module.load_state_dict`.

    Returns:
        The step, sampler epoch and extra that were saved; None when there is no intact
        checkpoint (a fresh start).

    Raises:
        ValueError: the checkpoint was not written by `save` (no muster.harness.torch
            metadata), or lacks the optimizer or scheduler asked for.
        RuntimeError: ranks found different latest checkpoints (their checkpoint
            directories are not the same shared one), or `load_state_dict` refused.
    """
    weights = _unwrapped(model)
    rank, world_size = _rank_and_world_size(ctx)
    if optimizer is not None:
        diagnose(ctx, model=model, optimizer=optimizer)
    latest = ctx.checkpoint.restore()
    _check_ranks_agree(latest)
    if latest is None:
        return None
    saved = _recorded(latest)
    weights.load_state_dict(_load(latest.path / MODEL_FILE, map_location), strict=strict)
    _load_if_given(optimizer, latest.path / OPTIMIZER_FILE, "an optimizer", map_location)
    _load_if_given(scheduler, latest.path / SCHEDULER_FILE, "a scheduler", map_location)
    extra_file = latest.path / EXTRA_FILE
    extra = _load(extra_file, map_location) if extra_file.exists() else None
    _restore_rng(_load(latest.path / RNG_FILE, "cpu"), rank, world_size, latest.path)
    return Resumed(step=latest.step, sampler_epoch=saved.get("sampler_epoch"), extra=extra,
                   path=latest.path, world_size=int(saved["world_size"]),
                   warm_start=latest.warm_start)


def save_sharded(
    ctx: Context, step: int, state_dict: dict[str, Any], *,
    metadata: Mapping[str, Any] | None = None, process_group: dist.ProcessGroup | None = None,
) -> None:
    """`dcp.save(state_dict)` as the checkpoint of `step`: every rank writes its shard into
    one directory, which rank 0 publishes once every rank's part is written
    (`ctx.checkpoint.save_sharded`).

    Call it on every rank, in the same order. `metadata` is rank 0's.

    Raises:
        CheckpointError: a rank failed, or (rank 0) publishing did; nothing was published.
        ValueError: torch.distributed's ranks are not muster's (RANK, WORLD_SIZE).
    """
    _check_same_ranks(ctx, process_group, "save_sharded")
    with ctx.checkpoint.save_sharded(step, metadata) as path:
        _dcp().save(state_dict, checkpoint_id=path, process_group=process_group)


def save_sharded_async(
    ctx: Context, step: int, state_dict: dict[str, Any], *,
    metadata: Mapping[str, Any] | None = None, process_group: dist.ProcessGroup | None = None,
) -> PendingSave:
    """`dcp.async_save(state_dict)` as the checkpoint of `step`: returns once the state is
    staged, and the checkpoint is published in the background once every rank's part is
    written (`ctx.checkpoint.save_sharded_async`). `process_group` needs a CPU backend
    (gloo), as for `dcp.async_save`; torch recommends one of its own for async saves.

    Raises:
        CheckpointError: the save could not start; a later failure is recorded, and
            `PendingSave.result()` raises it.
        ValueError: as `save_sharded`.
    """
    _check_same_ranks(ctx, process_group, "save_sharded_async")

    def start(path: Path) -> Waitable:
        began = _dcp().async_save(state_dict, checkpoint_id=path, process_group=process_group)
        upload: Waitable = getattr(began, "upload_completion", began)  # AsyncSaveResponse
        return upload

    return ctx.checkpoint.save_sharded_async(step, start, metadata)


def restore_sharded(
    ctx: Context, state_dict: dict[str, Any], *,
    process_group: dist.ProcessGroup | None = None,
) -> Checkpoint | None:
    """Load the latest intact checkpoint into `state_dict`, in place (`dcp.load`); the
    checkpoint, or None when there is none (a fresh start). Call it on every rank: each
    loads the same checkpoint.

    Raises:
        RuntimeError: ranks found different latest checkpoints.
    """
    latest = ctx.checkpoint.restore()
    _check_ranks_agree(latest)
    if latest is not None:
        _dcp().load(state_dict, checkpoint_id=latest.path, process_group=process_group)
    return latest


def diagnose(
    ctx: Context,
    *,
    model: nn.Module | None = None,
    optimizer: Stateful | None = None,
    loader: torch.utils.data.DataLoader[Any] | None = None,
) -> None:
    """Record this rank's coded-bias diagnostics; muster compares the ranks at the end.

    With `loader`: its sampler's type and seed, and the first indices of every pass over
    it (call it before the first pass). With `model` and `optimizer`: every
    `diagnostics.interval` optimizer steps, the local gradient norm before DDP's
    all-reduce and a hash of every parameter after the step (`restore` does this for the
    model and optimizer it is given). Calling it again for the same object adds nothing;
    with diagnostics off (`diagnostics.record: false`) it does nothing.

    Raises:
        TypeError: `model` is given without `optimizer` (its steps are the clock), or the
            other way round.
    """
    if (model is None) != (optimizer is None):
        raise TypeError("diagnose: give model and optimizer together (the optimizer's steps "
                        "are when the gradients are sampled)")
    if model is not None:
        attach_model(ctx, model, optimizer)
    if loader is not None:
        attach_loader(ctx, loader)


def should_stop(ctx: Context) -> bool:
    """`ctx.should_stop()` agreed by all ranks: True everywhere once any rank was asked.

    muster's stop reaches the ranks at slightly different moments; a rank that left the
    loop alone would leave the others waiting in their next all-reduce. A collective when
    torch.distributed is initialized; otherwise just `ctx.should_stop()`.
    """
    asked = ctx.should_stop()
    if not _distributed():
        return asked
    flag = torch.tensor([int(asked)], dtype=torch.int32, device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@functools.cache
def _dcp() -> Any:
    """torch.distributed.checkpoint, imported when first used (about a second)."""
    return importlib.import_module("torch.distributed.checkpoint")


def _check_same_ranks(ctx: Context, group: dist.ProcessGroup | None, what: str) -> None:
    """A sharded save waits for muster's ranks: torch.distributed's must be the same."""
    if not _distributed():
        return
    theirs = (dist.get_rank(group), dist.get_world_size(group))
    if theirs != (ctx.rank, ctx.world_size):
        raise ValueError(
            f"{what}: torch.distributed says rank {theirs[0]} of {theirs[1]}, muster rank "
            f"{ctx.rank} of {ctx.world_size}; a sharded save waits for muster's ranks, so "
            "they must agree (set RANK and WORLD_SIZE, as muster and torchrun do, and save "
            "with a group of every rank)")


def _rank_and_world_size(ctx: Context) -> tuple[int, int]:
    """The process group's rank and size when there is one, else the harness's."""
    if _distributed():
        return dist.get_rank(), dist.get_world_size()
    return ctx.rank, ctx.world_size


def _collective_device() -> torch.device:
    """NCCL reduces only CUDA tensors; every other backend takes CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _unwrapped(model: nn.Module) -> nn.Module:
    """The module whose state_dict has no wrapper prefixes (`module.`, `_orig_mod.`)."""
    _refuse_sharded(model)
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif isinstance(inner := getattr(model, "_orig_mod", None), nn.Module):
            model = inner  # torch.compile's OptimizedModule
        else:
            return model


def _refuse_sharded(model: nn.Module) -> None:
    if not dist.is_available():
        return
    fsdp = importlib.import_module("torch.distributed.fsdp")
    sharded = tuple(getattr(fsdp, name) for name in ("FullyShardedDataParallel", "FSDPModule")
                    if hasattr(fsdp, name))
    if any(isinstance(module, sharded) for module in model.modules()):
        raise NotImplementedError(
            "muster.harness.torch.save saves whole (unsharded) models; save an FSDP model "
            "with muster.harness.torch.save_sharded (torch.distributed.checkpoint)")


def _checked_metadata(metadata: Mapping[str, Any] | None) -> Metadata:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"save: metadata must be a mapping, got {type(metadata).__name__}")
    if METADATA_KEY in metadata:
        raise ValueError(f"save: metadata key {METADATA_KEY!r} is reserved for muster")
    try:
        json.dumps(dict(metadata))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"save: metadata must be JSON-serialisable: {exc}") from None
    return dict(metadata)


def _save_if_given(stateful: Stateful | None, path: Path) -> None:
    if stateful is not None:
        torch.save(stateful.state_dict(), path)


def _share_outcome(problem: str | None, rank: int, step: int) -> None:
    """Tell every rank whether rank 0 saved, so none waits for a checkpoint that never comes.

    On rank 0 the caller raises its own error; the other ranks raise CheckpointError.
    """
    if not _distributed():
        return
    message = [problem]
    dist.broadcast_object_list(message, src=0)
    if rank != 0 and message[0] is not None:
        raise CheckpointError(f"rank 0 could not save the checkpoint for step {step}: "
                              f"{message[0]}")


def _check_ranks_agree(latest: Checkpoint | None) -> None:
    if not _distributed():
        return
    names: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(names, None if latest is None else latest.path.name)
    if len(set(names)) > 1:
        found = ", ".join(f"rank {r}: {name or 'none'}" for r, name in enumerate(names))
        raise RuntimeError(
            f"the ranks found different latest checkpoints ({found}); every rank must "
            "see the same checkpoints directory (MUSTER_RUN_DIR on a shared file system)")


def _recorded(latest: Checkpoint) -> SavedBy:
    """What `save` recorded in the checkpoint's metadata; refuses one it did not write."""
    saved = latest.metadata.get(METADATA_KEY)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ValueError(
            f"the latest checkpoint {latest.path} was not saved by muster.harness.torch.save "
            f"(its metadata has no {METADATA_KEY!r} of format {FORMAT}); read it with "
            "ctx.checkpoint.restore() and your own loading code")
    return cast(SavedBy, saved)  # of our format: `save` wrote it


def _load(path: Path, map_location: MAP_LOCATION) -> Any:
    return torch.load(path, map_location=map_location, weights_only=True)


def _load_if_given(
    stateful: Stateful | None, path: Path, what: str, map_location: MAP_LOCATION
) -> None:
    if stateful is None:
        return
    if not path.exists():
        raise ValueError(f"restore: {what} was given, but the checkpoint {path.parent} "
                         f"was saved without one ({path.name} is missing)")
    stateful.load_state_dict(_load(path, map_location))


def _gathered_rng_states(rank: int, world_size: int) -> dict[int, RngState]:
    """Every rank's RNG state on rank 0 (a collective when distributed); {} elsewhere."""
    state = _rng_state()
    if not _distributed():
        return {rank: state} if rank == 0 else {}
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(state, gathered, dst=0)
    return dict(enumerate(gathered)) if gathered is not None else {}


def _rng_state() -> RngState:
    state = RngState(python=random.getstate(), torch=torch.get_rng_state())
    numpy = _numpy()
    if numpy is not None:
        kind, keys, position, has_gauss, cached_gaussian = numpy.random.get_state()
        # As a tensor, the state loads with weights_only=True (an ndarray would not).
        state["numpy"] = (kind, torch.from_numpy(keys.astype(numpy.int64)), position,
                          has_gauss, cached_gaussian)
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(saved: SavedRng, rank: int, world_size: int, path: Path) -> None:
    state = saved["ranks"].get(rank)
    saved_world_size = saved["world_size"]
    if state is not None:
        _set_rng_state(state)
    if saved_world_size != world_size or state is None:
        warnings.warn(_rng_warning(path, rank, world_size, saved_world_size, state is not None),
                      RuntimeWarning, stacklevel=3)


def _rng_warning(path: Path, rank: int, world_size: int, saved_world_size: int,
                 restored: bool) -> str:
    rng = (f"rank {rank}'s RNG state was restored" if restored else
           f"there is no RNG state for rank {rank}, so its RNG is left as it was")
    if saved_world_size == world_size:
        return (f"muster.harness.torch: {path.name} was saved without torch.distributed by "
                f"rank 0 alone: {rng}")
    return (f"muster.harness.torch: {path.name} was saved with world size {saved_world_size} "
            f"and is resumed with world size {world_size}: the model, optimizer and scheduler "
            f"were restored and {rng}; the data order will differ from an uninterrupted run")


def _set_rng_state(state: RngState) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = _numpy()
    if numpy is not None and "numpy" in state:
        kind, keys, position, has_gauss, cached_gaussian = state["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype(numpy.uint32), position,
                                has_gauss, cached_gaussian))
    if "cuda" in state and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)


@functools.cache
def _numpy() -> ModuleType | None:
    try:
        return importlib.import_module("numpy")
    except ImportError:
        return None
