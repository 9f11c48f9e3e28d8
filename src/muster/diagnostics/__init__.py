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
