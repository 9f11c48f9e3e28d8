"""Coded-bias diagnostics of a PyTorch loop, recorded per rank (`muster.harness.torch.diagnose`).

What each rank records into its diagnostics file (`muster.harness.diagnostics`), for the
platform to compare across ranks (`muster.diagnostics.bias`):

- each watched loader's sampler: its type, whether it draws randomly, whether it
  partitions the data by rank (DistributedSampler), and the seed it draws with (its
  generator's, or torch's global seed when it has none);
- every pass over a watched loader: how many indices its sampler yielded and the first
  `KEPT_INDICES` of them, so ranks that drew the same samples, and an order that repeats
  from epoch to epoch (`set_epoch` never called), show;
- every `interval` optimizer steps: this rank's local gradient norm before DDP's all-reduce
  (tensor hooks on the parameters see the gradient before it is accumulated and reduced),
  whether it was finite, and a hash of every parameter after the step (an integer sum of
  the parameter's bits: exact, and cheap on the device), so replicas that drift apart
  after DDP's sync show.

Hooks cost nothing on the steps between samples but a flag test per parameter gradient.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.hooks import RemovableHandle

from muster.harness.context import Context
from muster.harness.diagnostics import (
    DatasetRecord,
    DiagnosticsLog,
    ParamsRecord,
    PassRecord,
    SamplerRecord,
    UpdateRecord,
)

__all__ = ["KEPT_INDICES", "MAX_PARAMETERS", "attach_loader", "attach_model"]

KEPT_INDICES = 4096  # of each pass, per rank: enough to measure an overlap to a percent
MAX_PARAMETERS = 10_000  # hashed per sample; a larger model's first ones
MAX_NAME_CHARS = 200

_RANDOM = (RandomSampler, WeightedRandomSampler, SubsetRandomSampler)
_NORM_DTYPE = torch.float64
_INT_VIEWS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}

# What is already watched, and by what: a second `diagnose` in the same `init()` block
# (restore's, then the user's) adds nothing; in a later block it moves the watch to that
# block's log.
_loaders: weakref.WeakKeyDictionary[Any, _RecordingSampler | None] = weakref.WeakKeyDictionary()
_models: weakref.WeakKeyDictionary[nn.Module, _ModelWatch] = weakref.WeakKeyDictionary()
_sampler_ids = itertools.count()


def attach_loader(ctx: Context, loader: DataLoader[Any]) -> None:
    """Record `loader`'s sampler, and every pass over it, into the rank's diagnostics."""
    log = _log(ctx)
    if log is None:
        return
    if loader in _loaders:
        recording = _loaders[loader]
        if recording is not None:
            recording.log = log
        return
    batches = loader.batch_sampler
    custom = batches is not None and not isinstance(batches, BatchSampler)
    sampler = (batches if custom else
               batches.sampler if isinstance(batches, BatchSampler) else loader.sampler)
    number = next(_sampler_ids)
    root, to_root = _root_dataset(loader.dataset)
    streamed = isinstance(loader.dataset, IterableDataset)
    log.record(_describe(number, sampler, DatasetRecord(
        type=type(root).__name__, size=None if streamed else _size(root))))
    # An IterableDataset yields its own samples (its sampler's None says nothing), and a
    # custom batch sampler's indices cannot be reached: their seeds are recorded, not passes.
    wrapped: _RecordingSampler | None = None
    if not streamed and isinstance(batches, BatchSampler):
        wrapped = _RecordingSampler(sampler, number, log, to_root)
        batches.sampler = wrapped  # BatchSampler keeps it as a plain attribute
    elif not streamed and batches is None and isinstance(sampler, Sampler):
        wrapped = _RecordingSampler(sampler, number, log, to_root)
        object.__setattr__(loader, "sampler", wrapped)  # DataLoader refuses a plain set
    _loaders[loader] = wrapped


def attach_model(ctx: Context, model: nn.Module, optimizer: Any) -> None:
    """Sample `model`'s local gradient norm and parameter hashes every `interval` steps of
    `optimizer` (both needed: the optimizer's steps are the clock)."""
    log = _log(ctx)
    if log is None or log.interval is None:
        return
    if not hasattr(optimizer, "register_step_post_hook"):
        return  # not a torch.optim.Optimizer: there is no step to sample at
    watch = _models.get(model)
    if watch is None:
        _models[model] = _ModelWatch(model, optimizer, log, log.interval)
    elif not watch.follows(optimizer, log):  # a new init() block, or a new optimizer
        watch.follow(optimizer, log, log.interval)


def _log(ctx: Context) -> DiagnosticsLog | None:
    log = ctx._diagnostics
    return log if log.enabled else None


def _root_dataset(dataset: Any) -> tuple[Any, Callable[[Any], Any] | None]:
    """The data set under any `Subset`s, and how an index into `dataset` maps to it: ranks
    that each take their own Subset draw positions that mean nothing side by side."""
    maps: list[Sequence[Any]] = []
    while isinstance(dataset, Subset):
        maps.append(dataset.indices)
        dataset = dataset.dataset
    if not maps:
        return dataset, None

    def to_root(index: Any) -> Any:
        for indices in maps:
            index = indices[index]
        return int(index) if isinstance(index, int | torch.Tensor) else index

    return dataset, to_root


def _size(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an IterableDataset without __len__
        return None


def _describe(number: int, sampler: object, dataset: DatasetRecord) -> SamplerRecord:
    partitioned = isinstance(sampler, DistributedSampler) or (
        isinstance(getattr(sampler, "num_replicas", None), int)
        and isinstance(getattr(sampler, "rank", None), int))
    generator = getattr(sampler, "generator", None)
    seed = getattr(sampler, "seed", None) if partitioned else None
    if isinstance(generator, torch.Generator):
        seed = int(generator.initial_seed())
    return SamplerRecord(
        kind="sampler", sampler=number, type=type(sampler).__name__,
        random=isinstance(sampler, _RANDOM) or bool(getattr(sampler, "shuffle", False)),
        partitioned=partitioned,
        replacement=getattr(sampler, "replacement", None),
        generator_seed=seed if isinstance(seed, int) else None,
        torch_initial=int(torch.initial_seed()),
        dataset=dataset,
    )


class _RecordingSampler(Sampler[Any]):
    """Yields what the wrapped sampler yields, keeping the first indices of each pass."""

    def __init__(self, inner: Any, number: int, log: DiagnosticsLog,
                 to_root: Callable[[Any], Any] | None) -> None:
        self.inner = inner
        self._number = number
        self.log = log  # the current init() block's
        self._to_root = to_root
        self._passes = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:  # set_epoch, epoch, num_samples, ...
        return getattr(self.__dict__["inner"], name)

    def __iter__(self) -> Iterator[Any]:
        """The wrapped sampler's indices. The first KEPT_INDICES of a pass are drawn from it
        at once (as `list(sampler)` would), the rest as the loader asks; both are handed on
        by C-level iterators, so the loader pays next to nothing per index."""
        number, self._passes = self._passes, self._passes + 1
        epoch = getattr(self.inner, "epoch", None)
        iterator = iter(self.inner)
        head = list(itertools.islice(iterator, KEPT_INDICES))
        unsent = iter(head)
        counter = itertools.count()
        rest = map(operator.itemgetter(0), zip(iterator, counter, strict=False))  # count: endless
        complete = False
        try:
            yield from unsent
            yield from rest
            complete = True
        finally:
            sent = len(head) - operator.length_hint(unsent) + next(counter)
            self.log.record(PassRecord({
                "kind": "pass", "sampler": self._number, "pass": number,
                "epoch": epoch if isinstance(epoch, int) else None,
                "count": sent, "complete": complete, "indices": self._kept_indices(head)}))

    def _kept_indices(self, head: list[Any]) -> list[Any]:
        if self._to_root is None and set(map(type, head)) <= {int}:
            return head
        return [self._kept(index) for index in head]

    def _kept(self, index: Any) -> Any:
        if self._to_root is not None:
            # Not an index into the Subset (a custom sampler's key): kept as it is.
            with contextlib.suppress(IndexError, TypeError, KeyError):
                index = self._to_root(index)
        return index if type(index) is int else _key(index)


def _key(index: Any) -> Any:
    if isinstance(index, torch.Tensor) and index.numel() == 1:
        return int(index.item())
    return repr(index)[:MAX_NAME_CHARS]


class _ModelWatch:
    """The gradient and parameter samples of one model, clocked by its optimizer's steps.

    A sample is the norm of the local gradients each parameter received since its `.grad`
    was last reset to None (`zero_grad()`: every micro-batch of an accumulation counts),
    taken at the optimizer's next step. So the gradients of a step skipped (a GradScaler's
    overflow, a script's bad batch) are forgotten at the next `zero_grad()`, never carried
    into a sample. (With `zero_grad(set_to_none=False)` they are carried.)
    """

    def __init__(self, model: nn.Module, optimizer: Any, log: DiagnosticsLog,
                 interval: int) -> None:
        named = [(name, p) for name, p in _inner(model).named_parameters()
                 if p.requires_grad][:MAX_PARAMETERS]
        self._names = [name[:MAX_NAME_CHARS] for name, _ in named]
        self._parameters = [p for _, p in named]
        # DDP keeps its replicas equal: their hashes are compared.
        self._replicated = isinstance(model, nn.parallel.DistributedDataParallel)
        self._norms: dict[int, list[torch.Tensor]] = {}  # by parameter
        self._handles: list[RemovableHandle] = []  # the optimizer's hook
        # Only while a step is sampled: none between.
        self._gradient_hooks: list[RemovableHandle] = []
        self.follow(optimizer, log, interval)

    def follow(self, optimizer: Any, log: DiagnosticsLog, interval: int) -> None:
        """Sample at `optimizer`'s steps into `log` from now on (its first step sampled).

        Between samples the parameters carry no hook: a hook costs a Python call per
        parameter per backward pass, which a step of a small model notices."""
        for handle in self._handles:
            handle.remove()
        self._log, self._interval = log, interval
        self._optimizer = weakref.ref(optimizer)
        self._steps, self._norms = 0, {}
        self._handles = [optimizer.register_step_post_hook(self._after_step)]
        self._sample_next(True)
        log.record(ParamsRecord(kind="params", names=self._names,
                                replicated=self._replicated))

    def _sample_next(self, sampling: bool) -> None:
        """Hook the parameters' gradients for the next step, or unhook them."""
        if sampling and not self._gradient_hooks:
            self._gradient_hooks = [
                _hookable(parameter).register_hook(
                    functools.partial(self._on_gradient, index, parameter))
                for index, parameter in enumerate(self._parameters)]
        elif not sampling:
            for handle in self._gradient_hooks:
                handle.remove()
            self._gradient_hooks = []

    def _on_gradient(self, index: int, parameter: torch.Tensor, gradient: torch.Tensor
                     ) -> None:
        # Called before the gradient is accumulated into .grad and DDP all-reduces it: the
        # gradient of this rank's batch.
        # In float64: a gradient scaled by a GradScaler (up to 2**24 and beyond) squares
        # past float32's range (the norm is squared again when the sample is taken).
        norm = torch.linalg.vector_norm(gradient.detach(), dtype=_NORM_DTYPE)
        if parameter.grad is None:  # the first since zero_grad(): earlier ones are stale
            self._norms[index] = [norm]
        else:
            self._norms.setdefault(index, []).append(norm)

    def follows(self, optimizer: Any, log: DiagnosticsLog) -> bool:
        """Whether it samples at `optimizer`'s steps into `log` already."""
        return self._log is log and self._optimizer() is optimizer

    def _after_step(self, *_: Any) -> None:
        step, self._steps = self._steps, self._steps + 1
        if self._gradient_hooks:
            self._record(step)
        self._sample_next(self._steps % self._interval == 0)

    def _record(self, step: int) -> None:
        with torch.no_grad():
            norms = [norm for kept in self._norms.values() for norm in kept]
            norm = torch.stack(norms).square().sum().sqrt() if norms else None
            self._norms = {}
            hashes = torch.stack([_bits_sum(p) for p in self._parameters]).tolist()
        value = None if norm is None else float(norm.item())
        self._log.record(UpdateRecord(
            kind="update", update=step, grad_norm=value,
            grad_finite=None if value is None else bool(value == value
                                                        and abs(value) != float("inf")),
            hash=hashes,
        ))


class _Hookable(Protocol):
    def register_hook(self, hook: Callable[[torch.Tensor], torch.Tensor | None]
                      ) -> RemovableHandle: ...


def _hookable(parameter: torch.Tensor) -> _Hookable:
    # torch leaves Tensor.register_hook unannotated; this is its documented signature.
    return cast(_Hookable, parameter)


def _inner(model: nn.Module) -> nn.Module:
    while True:
        inner = getattr(model, "module", None)
        if isinstance(inner, nn.Module) and isinstance(
                model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = inner
        elif isinstance(compiled := getattr(model, "_orig_mod", None), nn.Module):
            model = compiled
        else:
            return model


def _bits_sum(parameter: torch.Tensor) -> torch.Tensor:
    """The sum of the parameter's elements read as integers: the same bits, the same sum,
    in any reduction order (integer addition wraps, it never rounds)."""
    data = parameter.detach()
    if data.is_complex():
        data = torch.view_as_real(data)
    view = _INT_VIEWS.get(data.element_size())
    if view is None or data.dtype == torch.bool:
        return data.to(torch.int64).sum()
    return data.contiguous().reshape(-1).view(view).sum(dtype=torch.int64)
