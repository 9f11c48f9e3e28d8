"""The GPU inventory: which GPUs this machine has, and how much memory each uses now.

One interface, three implementations, chosen by the cluster config's `gpus:` setting
(`open_inventory`):

- `NvmlInventory`: the real GPUs, through NVML (the `nvidia-ml-py` package);
- `FakeInventory`: GPUs listed in the cluster config, whose used memory is a number in a
  file per GPU, so that the scheduler can be driven and tested on a machine without GPUs;
- `NoGpus`: none, with the reason.

Contract, for every implementation: `gpus()` is read once, when the inventory is opened,
and never changes; `memory_used()` reads the GPU now and may block for the time of one
driver call; `close()` may be called more than once.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from muster.atomic import atomic_write_bytes
from muster.config.cluster import FakeGpuConfig, gpu_type_from_name
from muster.errors import GpuError
from muster.sizes import format_size
from muster.words import count

__all__ = [
    "FakeInventory",
    "Gpu",
    "GpuInventory",
    "NoGpus",
    "NvmlInventory",
    "open_inventory",
]


@dataclass(frozen=True)
class Gpu:
    """One GPU as the scheduler sees it."""

    index: int
    name: str  # e.g. "NVIDIA H200", "Fake-A100"
    type: str  # e.g. "h200": what resources.gpu_type is compared with, case-insensitively
    memory_total: int  # bytes
    uuid: str | None = None


class GpuInventory(abc.ABC):
    """The GPUs of this machine, read once when opened, and their memory use, read live."""

    source: str  # "nvml", "fake" or "none"

    def __init__(self, gpus: list[Gpu], note: str) -> None:
        self._gpus = {gpu.index: gpu for gpu in sorted(gpus, key=lambda gpu: gpu.index)}
        self.note = note  # one line for people: "2 GPUs from NVML", "no GPUs: <why>"

    def gpus(self) -> list[Gpu]:
        """The inventory, by index."""
        return list(self._gpus.values())

    def gpu(self, index: int) -> Gpu:
        """The GPU at `index`.

        Raises:
            GpuError: there is no such GPU.
        """
        gpu = self._gpus.get(index)
        if gpu is None:
            raise self._no_such_gpu(index)
        return gpu

    @abc.abstractmethod
    def memory_used(self, index: int) -> int:
        """Bytes of GPU `index`'s memory in use now, between 0 and its `memory_total`.

        Raises:
            GpuError: there is no such GPU, or its memory use cannot be read.
        """

    def close(self) -> None:  # noqa: B027 - most inventories hold nothing to release
        """Release the driver, if any; idempotent."""

    def _no_such_gpu(self, index: int) -> GpuError:
        if not self._gpus:
            return GpuError(f"there is no GPU {index}; {self.note}")
        have = ", ".join(str(i) for i in self._gpus)
        return GpuError(f"there is no GPU {index}; the GPUs are {have} ({self.note})")


class NoGpus(GpuInventory):
    """No GPUs at all; `note` says why."""

    source = "none"

    def __init__(self, note: str) -> None:
        super().__init__([], note)

    def memory_used(self, index: int) -> int:
        raise self._no_such_gpu(index)


class NvmlInventory(GpuInventory):
    """The GPUs that the NVIDIA driver reports, through NVML.

    Raises:
        GpuError: from the constructor, when `nvidia-ml-py` is not installed, NVML cannot
            start (no driver), or a GPU cannot be listed.
    """

    source = "nvml"

    def __init__(self) -> None:
        self._nvml = _import_pynvml()
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise GpuError(f"NVML is not available ({_init_failure(self._nvml, exc)})") from None
        self._closed = False
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = {i: self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)}
            gpus = [self._read_gpu(index, handle) for index, handle in self._handles.items()]
        except self._nvml.NVMLError as exc:
            self.close()
            raise GpuError(f"NVML started but cannot list the GPUs: {exc}") from None
        super().__init__(gpus, f"{count(len(gpus), 'GPU')} from NVML")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._nvml.nvmlShutdown()

    def _read_gpu(self, index: int, handle: Any) -> Gpu:
        name = _text(self._nvml.nvmlDeviceGetName(handle))
        return Gpu(
            index=index,
            name=name,
            type=gpu_type_from_name(name),
            memory_total=int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total),
            uuid=_text(self._nvml.nvmlDeviceGetUUID(handle)),
        )

    def memory_used(self, index: int) -> int:
        gpu = self.gpu(index)
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[gpu.index]).used)
        except self._nvml.NVMLError as exc:
            raise GpuError(f"cannot read the memory use of GPU {gpu.index} ({gpu.name}): "
                           f"NVML says {exc}") from None


class FakeInventory(GpuInventory):
    """GPUs from the cluster config; GPU i's used memory is the number in `root/<i>/used_bytes`
    (missing: 0), which tests and tools write with `set_used`."""

    source = "fake"

    def __init__(self, specs: list[FakeGpuConfig], root: Path) -> None:
        self.root = root
        gpus = [
            Gpu(spec.index, spec.name, spec.type or gpu_type_from_name(spec.name), spec.memory)
            for spec in specs
        ]
        super().__init__(gpus, f"{count(len(gpus), 'fake GPU')} from the cluster config")

    def used_path(self, index: int) -> Path:
        """The file that holds GPU `index`'s used memory in bytes."""
        return self.root / str(index) / "used_bytes"

    def set_used(self, index: int, used: int) -> None:
        """Make GPU `index` report `used` bytes in use, atomically for concurrent readers.

        Raises:
            GpuError: there is no such GPU.
            ValueError: `used` is negative or more than the GPU's memory.
        """
        total = self.gpu(index).memory_total
        if not 0 <= used <= total:
            raise ValueError(f"used must be between 0 and GPU {index}'s {total} bytes, "
                             f"but got {used=}")
        path = self.used_path(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, f"{used}\n".encode())

    def memory_used(self, index: int) -> int:
        gpu = self.gpu(index)
        path = self.used_path(index)
        try:
            text = path.read_bytes().decode("utf-8", errors="replace").strip()
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError as exc:
            raise GpuError(f"cannot read the memory use of fake GPU {gpu.index} "
                           f"({gpu.name}): cannot read {path}: {exc.strerror}") from None
        if not re.fullmatch(r"[0-9]+", text):
            raise GpuError(f"cannot read the memory use of fake GPU {gpu.index} ({gpu.name}): "
                           f"{path} must hold a whole number of bytes, but holds {text[:60]!r}")
        used = int(text)
        if used > gpu.memory_total:
            raise GpuError(f"fake GPU {gpu.index} ({gpu.name}) has "
                           f"{format_size(gpu.memory_total)}, but {path} says {used} bytes "
                           "are in use")
        return used


def open_inventory(
    setting: Literal["auto", "none"] | list[FakeGpuConfig], fake_root: Path
) -> GpuInventory:
    """The inventory that the cluster config's `gpus:` setting asks for.

    `auto` never raises: without NVML (no driver, no `nvidia-ml-py`) it is `NoGpus`, whose
    note says why.
    """
    if setting == "none":
        return NoGpus("no GPUs: the cluster config says gpus: none")
    if setting == "auto":
        try:
            return NvmlInventory()
        except GpuError as exc:
            return NoGpus(f"no GPUs: {exc}")
    return FakeInventory(setting, fake_root)


def _import_pynvml() -> Any:
    """The `pynvml` module, imported only when NVML is asked for."""
    try:
        import pynvml
    except ImportError:
        raise GpuError(
            "NVML is not available (the nvidia-ml-py package is not installed)"
        ) from None
    return pynvml


def _init_failure(nvml: Any, exc: Exception) -> str:
    if isinstance(exc, nvml.NVMLError_LibraryNotFound):
        return "libnvidia-ml.so.1 not found: is the NVIDIA driver installed?"
    return str(exc)


def _text(value: str | bytes) -> str:
    """NVML strings: bytes from older nvidia-ml-py versions, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else value

