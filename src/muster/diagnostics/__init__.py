"""Reproducibility snapshots and their diffs (issue 17).

A **snapshot** says what a run was made of. It has two parts, both JSON objects:

The *trial* part, recorded by the server when the trial is created (`trial describe`'s
`snapshot`):

    {"code": {"tree_sha256": str, "files": int,
              "git": {"commit": str, "branch": str | None, "dirty": bool,
                      "diff_sha256": str | None} | None},
     "config": {...the experiment config, normalised...},
     "hparams": {...}, "seed": int | None,
     "environment": {"key": str | None, "packages": {name: version}},
     "data": {"fingerprint": str | None}}

The *rank* part, written by the harness in each rank at `init()` and completed when the
rank's harness context ends (`muster.harness.snapshot`; stdlib only, it reads torch, numpy
and threadpoolctl only when the script already imported them):

    {"python": {"version": str, "implementation": str},
     "platform": {"system": str, "release": str, "machine": str, "hostname": str,
                  "cpu": str | None},
     "frameworks": {"torch": str | None, "cuda": str | None, "cudnn": str | None,
                    "nccl": str | None, "numpy": str | None},
     "driver": str | None,
     "gpus": [{"index": int, "name": str | None, "uuid": str | None}],  # once CUDA is up
     "libraries": {"libcublas": "libcublas.so.11.10.3.66", ...},  # family -> loaded file
     "packages": {"nvidia-cublas-cu11": "11.10.3.66", ...},  # nvidia-* and torch wheels
     "numerics": {"tf32_matmul": bool | None, "tf32_cudnn": bool | None,
                  "cudnn_benchmark": bool | None, "cudnn_deterministic": bool | None,
                  "deterministic_algorithms": bool | None,
                  "float32_matmul_precision": str | None},
     "blas": [{"api": str, "library": str, "version": str | None, "threads": int}],
     "variables": {NAME: value},  # only the allow-listed numerics variables
     "seed": {"torch_initial": int | None}}

Every field a process cannot know is null (a CPU-only build has no CUDA), never missing.

The *outside* part, recorded by the server at each attempt's launch, harness or not
(`muster.supervise.outside_snapshot`; `runs/<uuid>/attempt-<n>.outside.json`, the server's
file): what muster knows of the process without it, asked of the trial's own `python`
(`-I -S`: nothing of the user's imported) and read from its layer's site-packages:

    {"source": "outside", "attempt": int, "recorded_at": float,
     "python": {"version": str | None, "implementation": str | None},
     "packages": {name: version} | None,  # the layer's, then the lower layers', as imported
     "code": {"tree_sha256": str, "files": int} | None,  # the context snapshot's
     "unknown": {field: why}}  # what could not be known, and why

It is never taken for what a harness saw: the rank parts say that, and win where both speak.

`diff` compares snapshots (pure): what differs, grouped and ordered most result-relevant
first, volatile fields (hostnames, GPU uuids, paths) left out; `muster.services.snapshots`
assembles a trial's parts and serves `muster trial diff`; `code.git` is the context's git
state as the client sent it (`muster.git_state`); `environment.packages` is the built
environment's `pip freeze`, or, on the base interpreter, what that interpreter imports.

`bias` judges what each rank's harness recorded of its data and gradients
(`rank-<r>.diagnostics.jsonl`, read by `read_rank_records`): the coded-bias checks
(docs/diagnostics.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TypedDict

from muster.atomic import open_regular, read_regular
from muster.diagnostics.bias import RankRecords, parse_records
from muster.diagnostics.code_tree import CodeTree
from muster.rundir import AttemptDir, RankFile, RunDir
from muster.words import count

__all__ = ["MAX_DIAGNOSTICS_BYTES", "MAX_SNAPSHOT_BYTES", "OUTSIDE_SOURCE", "OutsidePart",
           "Part", "read_outside_part", "read_rank_parts", "read_rank_records"]

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 4 << 20  # a rank's snapshot file; a larger one is not the harness's
MAX_DIAGNOSTICS_BYTES = 64 << 20  # read of a rank's diagnostics file (the harness writes 32)
MAX_RECORD_BYTES = 1 << 20  # one line of it; a longer one is skipped
OUTSIDE_SOURCE = "outside"  # an outside part's `source`: never the harness's

# A part as read back from its file: a JSON object whose fields are not checked (a script
# may write anything to a rank's file, an older harness or server wrote less); `diff`
# compares it field by field. The shapes written are `muster.harness.snapshot.RankPart`,
# `OutsidePart` and the trial part above.
Part = dict[str, object]


class OutsideInterpreter(TypedDict):
    version: str | None
    implementation: str | None


class OutsidePart(TypedDict):
    """The outside part, as `muster.supervise.outside_snapshot` writes it."""

    source: str  # OUTSIDE_SOURCE
    attempt: int
    recorded_at: float
    python: OutsideInterpreter
    packages: dict[str, str] | None
    code: CodeTree | None
    unknown: dict[str, str]  # field → why it could not be known


def read_outside_part(run_dir: RunDir, attempts: list[int]) -> Part | None:
    """The outside part of the latest of `attempts` (numbers) that has one; None when none
    has (a trial from before they were recorded, or its record is still being made). An
    unreadable or malformed one is passed over with a warning."""
    for number in sorted(attempts, reverse=True):
        path = run_dir.outside_snapshot(number)
        try:
            if path.stat().st_size > MAX_SNAPSHOT_BYTES:
                raise ValueError(f"over {MAX_SNAPSHOT_BYTES} bytes")
            document = json.loads(read_regular(path))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            log.warning("the outside snapshot %s cannot be read: %s", path, exc)
            continue
        if isinstance(document, dict) and document.get("source") == OUTSIDE_SOURCE:
            return document
        log.warning("%s is not an outside snapshot; left out", path)
    return None


def read_rank_parts(attempt_dir: Path) -> dict[int, Part]:
    """The rank parts the harness wrote in one attempt, by rank; an unreadable, oversized or
    malformed one is left out with a warning (a run without the harness has none)."""
    parts: dict[int, Part] = {}
    for rank, path in AttemptDir(attempt_dir).ranks_with(RankFile.SNAPSHOT):
        try:
            size = path.stat().st_size
            document = json.loads(read_regular(path)) if size <= MAX_SNAPSHOT_BYTES else None
        except (OSError, ValueError) as exc:
            log.warning("rank %d's snapshot %s cannot be read: %s", rank, path, exc)
            continue
        if isinstance(document, dict):
            parts[rank] = document
        else:
            log.warning("rank %d's snapshot %s is not the harness's (over %d bytes, or not a "
                        "JSON object); left out", rank, path, MAX_SNAPSHOT_BYTES)
    return parts


def read_rank_records(attempt_dir: Path) -> dict[int, RankRecords]:
    """What each rank's diagnostics file in one attempt holds (`muster.diagnostics.bias`),
    by rank; the first MAX_DIAGNOSTICS_BYTES of each, malformed lines skipped."""
    found: dict[int, RankRecords] = {}
    for rank, path in AttemptDir(attempt_dir).ranks_with(RankFile.DIAGNOSTICS):
        try:
            with open(open_regular(path), "rb", closefd=True) as stream:
                found[rank] = parse_records(_objects(stream, path))
        except OSError as exc:
            log.warning("rank %d's diagnostics %s cannot be read: %s", rank, path, exc)
    return found


def _objects(stream: BinaryIO, path: Path) -> Iterator[dict[str, object]]:
    read = skipped = 0
    while read < MAX_DIAGNOSTICS_BYTES:
        line = stream.readline(MAX_RECORD_BYTES + 1)
        if not line:
            break
        read += len(line)
        if len(line) > MAX_RECORD_BYTES or not line.endswith(b"\n"):
            skipped += 1  # too long (its rest is read past), or cut off at the end
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_RECORD_BYTES + 1)
                read += len(line)
            continue
        try:
            document = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(document, dict):
            yield document
    if skipped:
        log.warning("%s: %s skipped (malformed, cut off or over %d bytes)",
                    path, count(skipped, "diagnostics line"), MAX_RECORD_BYTES)
