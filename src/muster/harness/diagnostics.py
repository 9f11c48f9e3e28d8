"""The rank's diagnostics file: what `muster.harness.torch` saw of its data and gradients.

Standard library only. The torch side (`muster.harness.torch_diagnostics`) hands records
in; they are queued and appended as JSON lines to `rank-<r>.diagnostics.jsonl` by the
harness's background thread, like metrics. The platform judges every rank's file together
(`muster.diagnostics.bias`); the records are described there. How often a rank samples is
the job's MUSTER_DIAGNOSTICS (`muster.jobenv.diagnostics_interval`).

The file is bounded: past `MAX_FILE_BYTES` further records are dropped with one warning,
so a run of millions of steps at a small interval cannot fill a disk with diagnostics.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict

__all__ = ["MAX_FILE_BYTES", "DiagnosticsLog", "ParamsRecord", "PassRecord", "Record",
           "SamplerRecord", "UpdateRecord"]

MAX_FILE_BYTES = 32 << 20


# The records, one per line (`muster.diagnostics.bias` describes what each says).
class DatasetRecord(TypedDict):
    type: str
    size: int | None  # None: an IterableDataset without a length


class SamplerRecord(TypedDict):
    kind: Literal["sampler"]
    sampler: int  # the watched loader's number in this process
    type: str
    random: bool
    partitioned: bool
    replacement: bool | None
    generator_seed: int | None
    torch_initial: int
    dataset: DatasetRecord


# "pass" is a keyword: the functional form.
PassRecord = TypedDict("PassRecord", {
    "kind": Literal["pass"], "sampler": int, "pass": int, "epoch": int | None, "count": int,
    "complete": bool,
    "indices": list[Any],  # the first ones drawn: the dataset's own index values
})


class ParamsRecord(TypedDict):
    kind: Literal["params"]
    names: list[str]
    replicated: bool


class UpdateRecord(TypedDict):
    kind: Literal["update"]
    update: int  # the optimizer step
    grad_norm: float | None
    grad_finite: bool | None
    hash: list[int]  # one per parameter


Record = SamplerRecord | PassRecord | ParamsRecord | UpdateRecord


class DiagnosticsLog:
    """Queues records (`record`, any thread) and appends them as lines (`flush`)."""

    def __init__(self, path: Path, interval: int | None) -> None:
        self.path = path
        self.interval = interval  # None: the rank records nothing
        self._queue: deque[str] = deque()
        self._written = _size(path)  # a local run appends to the last run's file
        self._full = False
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.interval is not None

    def record(self, document: Record) -> None:
        """Queue one record (a JSON object; non-finite floats are written as null)."""
        if self.interval is None or self._full:
            return
        try:  # the common case: nothing to replace, and no walk over a list of indices
            text = json.dumps(document, separators=(",", ":"), allow_nan=False)
        except ValueError:
            text = json.dumps(_finite(document), separators=(",", ":"))
        self._queue.append(text + "\n")

    def flush(self) -> None:
        """Append the queued records.

        Raises:
            OSError: the write failed; the records are dropped (diagnostics are advisory).
        """
        with self._lock:
            lines = [self._queue.popleft() for _ in range(len(self._queue))]
            if not lines:
                return
            data = "".join(lines).encode()
            if self._written + len(data) > MAX_FILE_BYTES:
                self._full = True
                self._queue.clear()
                warnings.warn(f"muster.harness: {self.path} reached {MAX_FILE_BYTES >> 20} MiB; "
                              "later diagnostics are not recorded (raise diagnostics.interval)",
                              RuntimeWarning, stacklevel=2)
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            self._written += len(data)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # not there yet
        return 0


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as null: strict JSON, as every reader expects."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
