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

`diff` compares snapshots (pure): what differs, grouped and ordered most result-relevant
first, volatile fields (hostnames, GPU uuids, paths) left out; `muster.services.snapshots`
assembles a trial's parts and serves `muster trial diff`. Still to come (issue 17): the
git state of the context, the packages of a trial on the base interpreter, the snapshot in
`trial describe`, the cross-rank consistency check and the bias diagnostics.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from muster.atomic import read_regular
from muster.rundir import AttemptDir, RankFile

__all__ = ["MAX_SNAPSHOT_BYTES", "read_rank_parts"]

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 4 << 20  # a rank's snapshot file; a larger one is not the harness's


def read_rank_parts(attempt_dir: Path) -> dict[int, dict[str, Any]]:
    """The rank parts the harness wrote in one attempt, by rank; an unreadable, oversized or
    malformed one is left out with a warning (a run without the harness has none)."""
    parts: dict[int, dict[str, Any]] = {}
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
