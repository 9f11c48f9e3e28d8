"""What differs between two runs' snapshots, most result-relevant first."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest

from muster.diagnostics.diff import (
    GROUPS,
    Difference,
    TrialSnapshots,
    diff_ranks,
    diff_trials,
    result_relevant,
)
from muster.states import DiffGroup

MISSING = object()  # as a change's value: remove the field

TRIAL: dict[str, Any] = {
    "code": {"tree_sha256": "9f" * 32, "files": 14,
             "git": {"commit": "1f3c2e7a90b4d5c6e7f8091a2b3c4d5e6f708192", "branch": "main",
                     "dirty": False, "diff_sha256": None}},
    "config": {"name": "mnist-baseline", "description": "the baseline", "labels": ["mnist"],
               "entrypoint": ["python", "train.py"], "harness": True,
               "resources": {"slots_per_trial": 2},
               "hyperparameters": {"lr": {"type": "log", "minval": -4, "maxval": -1}},
               "data": {"path": "/data/mnist", "manifest": {"extensions": [".png"]}},
               "checkpoint_storage": {"type": "shared_fs", "path": "/srv/checkpoints"}},
    "hparams": {"lr": 0.01, "batch_size": 64, "optimizer": {"name": "adam", "beta1": 0.9}},
    "seed": 1234,
    "environment": {"key": "sha256:" + "3c" * 32,
                    "packages": {"numpy": "1.26.4", "torch": "2.0.1"}},
    "data": {"fingerprint": "sha256:" + "a1" * 32},
}

A100 = "NVIDIA A100-SXM4-80GB"
RANK: dict[str, Any] = {
    "python": {"version": "3.11.9", "implementation": "CPython"},
    "platform": {"system": "Linux", "release": "5.15.0-105-generic", "machine": "x86_64",
                 "hostname": "gpu-node-01", "cpu": "AMD EPYC 7763 64-Core Processor"},
    "frameworks": {"torch": "2.0.1+cu117", "cuda": "11.7", "cudnn": "8500",
                   "nccl": "2.14.3", "numpy": "1.26.4"},
    "driver": "535.104.05",
    "gpus": [{"index": 0, "name": A100, "uuid": "GPU-0b8c6f1e-1111"},
             {"index": 1, "name": A100, "uuid": "GPU-0b8c6f1e-2222"}],
    "libraries": {"libcublas": "libcublas.so.11.10.3.66", "libcudnn": "libcudnn.so.8.5.0",
                  "libnccl": "libnccl.so.2.14.3"},
    "packages": {"torch": "2.0.1+cu117", "nvidia-cublas-cu11": "11.10.3.66",
                 "nvidia-cudnn-cu11": "8.5.0.96"},
    "numerics": {"tf32_matmul": False, "tf32_cudnn": True, "cudnn_benchmark": False,
                 "cudnn_deterministic": True, "deterministic_algorithms": True,
                 "float32_matmul_precision": "highest"},
    "blas": [{"api": "blas", "library": "libopenblas", "version": "0.3.23", "threads": 64},
             {"api": "openmp", "library": "libgomp", "version": None, "threads": 64}],
    "variables": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0",
                  "OMP_NUM_THREADS": "1"},
    "seed": {"torch_initial": 42},
}


def changed(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `base` with each dotted path set to its value (MISSING removes it)."""
    part = copy.deepcopy(dict(base))
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = part
        for key in parents:
            node = node.setdefault(key, {})
        if value is MISSING:
            node.pop(last, None)
        else:
            node[last] = value
    return part


def snap(trial: Mapping[str, Any] | None = None, rank: Mapping[str, Any] | None = None,
         ranks: int = 1, per_rank: Mapping[int, Mapping[str, Any]] | None = None,
         ) -> TrialSnapshots:
    """A trial's snapshots: every rank gets `rank`'s changes, then its own in `per_rank`."""
    per_rank = per_rank or {}
    return TrialSnapshots(
        trial=changed(TRIAL, trial or {}),
        ranks={r: changed(changed(RANK, rank or {}), per_rank.get(r, {}))
               for r in range(ranks)})


def rows(differences: list[Difference]) -> list[tuple[Any, ...]]:
    return [(d.group, d.field, d.a, d.b, d.rank) for d in differences]


CUBLAS_OLD, CUBLAS_NEW = "libcublas.so.11.10.1.25", "libcublas.so.11.10.3.66"
COMMIT_B = "8e0d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a291807"


@pytest.mark.parametrize(("a", "b", "expected"), [
    pytest.param(snap(), snap(), [], id="identical"),
    pytest.param(
        snap(rank={"platform.hostname": "gpu-node-01", "python.executable": "/venv/a/python"}),
        snap(rank={"platform.hostname": "gpu-node-07", "python.executable": "/venv/b/python",
                   "gpus": [{"index": 0, "name": A100, "uuid": "GPU-9999"},
                            {"index": 1, "name": A100, "uuid": "GPU-8888"}]},
             trial={"config.data.path": "/mnt/mnist",
                    "config.checkpoint_storage.path": "/srv/other"}),
        [], id="only-volatile-fields"),
    pytest.param(
        snap(), snap(trial={"environment.packages.numpy": "2.1.0"}),
        [("packages", "environment.packages.numpy", "1.26.4", "2.1.0", None)],
        id="one-package"),
    pytest.param(
        snap(), snap(rank={"variables.OMP_NUM_THREADS": "4"}),
        [("numerics", "variables.OMP_NUM_THREADS", "1", "4", 0)], id="one-variable"),
    pytest.param(
        snap(), snap(trial={"code.git.commit": COMMIT_B, "environment.packages.numpy": "2.1.0"}),
        [("code", "code.git.commit", TRIAL["code"]["git"]["commit"], COMMIT_B, None),
         ("packages", "environment.packages.numpy", "1.26.4", "2.1.0", None)],
        id="commit-first-before-package"),
    pytest.param(
        snap(), snap(trial={"hparams.lr": 0.001}),
        [("config", "hparams.lr", 0.01, 0.001, None)], id="hparam"),
    pytest.param(
        snap(rank={"libraries.libcublas": CUBLAS_OLD}),
        snap(rank={"libraries.libcublas": CUBLAS_NEW}),
        [("frameworks", "libraries.libcublas", CUBLAS_OLD, CUBLAS_NEW, 0)],
        id="libcublas-key-case"),
    pytest.param(
        snap(), snap(rank={"variables.NCCL_ALGO": "Ring"}),
        [("numerics", "variables.NCCL_ALGO", None, "Ring", 0)], id="missing-on-one-side"),
    pytest.param(
        snap(rank={"frameworks.cudnn": None}), snap(rank={"frameworks.cudnn": MISSING}),
        [], id="null-is-missing"),
    pytest.param(
        snap(trial={"code.git": None}), snap(),
        [("code", "code.git.commit", None, TRIAL["code"]["git"]["commit"], None),
         ("code", "code.git.dirty", None, False, None),
         ("code", "code.git.branch", None, "main", None)],
        id="no-git-on-one-side"),
    pytest.param(
        snap(), snap(trial={"config.name": "rerun", "config.description": "again",
                            "config.labels": ["mnist", "rerun"],
                            "config.hyperparameters.lr": 0.02}),
        [], id="names-labels-and-search-space-left-out"),
    pytest.param(
        snap(), snap(trial={"seed": 99}, rank={"seed.torch_initial": 99}),
        [("config", "seed", 1234, 99, None),
         ("numerics", "seed.torch_initial", 42, 99, 0)], id="seeds"),
    pytest.param(
        snap(), snap(trial={"data.fingerprint": "sha256:" + "b2" * 32}),
        [("config", "data.fingerprint", "sha256:" + "a1" * 32, "sha256:" + "b2" * 32, None)],
        id="data"),
    pytest.param(
        snap(), snap(rank={"packages.path": "16.10.0"}),
        [("packages", "packages.path", None, "16.10.0", 0)],
        id="a-package-called-path-is-not-volatile"),
    pytest.param(
        snap(), snap(trial={"hparams.path": "b", "hparams.loader.path": "/scratch/b"}),
        [("config", "hparams.path", None, "b", None)],
        id="a-hyperparameter-called-path-is-not-volatile-one-under-it-is"),
    pytest.param(
        snap(), snap(rank={"python.version": "3.12.3", "python.implementation": "PyPy",
                           "platform.cpu": "Intel Xeon", "driver": "550.54.15"}),
        [("frameworks", "driver", "535.104.05", "550.54.15", 0),
         ("frameworks", "python.version", "3.11.9", "3.12.3", 0),
         ("hardware", "platform.cpu", "AMD EPYC 7763 64-Core Processor", "Intel Xeon", 0),
         ("platform", "python.implementation", "CPython", "PyPy", 0)],
        id="python-version-is-frameworks"),
    pytest.param(
        snap(), snap(rank={"unknown_future_field": "x"}, trial={"queue": "fast"}),
        [("config", "queue", None, "fast", None),
         ("numerics", "unknown_future_field", None, "x", 0)],
        id="unknown-fields-are-relevant"),
])
def test_diff_trials(a: TrialSnapshots, b: TrialSnapshots, expected: list[Any]) -> None:
    assert rows(diff_trials(a, b)) == expected


def test_libcublas_key_case_is_first_and_reads_well() -> None:
    """torch reports cuda 11.7 for both 11.7.0 and 11.7.1; the loaded cuBLAS tells them
    apart."""
    differences = diff_trials(snap(rank={"libraries.libcublas": CUBLAS_OLD}),
                              snap(rank={"libraries.libcublas": CUBLAS_NEW}))
    assert [d.line() for d in differences] == [
        "libcublas: libcublas.so.11.10.1.25 vs libcublas.so.11.10.3.66 (rank 0)"]
    assert result_relevant(differences[0])


def test_groups_come_in_order() -> None:
    b = snap(trial={"code.git.commit": COMMIT_B, "hparams.lr": 0.1,
                    "environment.packages.numpy": "2.1.0"},
             rank={"platform.release": "6.1.0", "gpus": [{"index": 0, "name": "NVIDIA H100"}],
                   "numerics.tf32_matmul": True, "frameworks.torch": "2.1.0"})
    assert [d.group for d in diff_trials(snap(), b)] == list(GROUPS)
    assert GROUPS == ("code", "config", "packages", "frameworks", "numerics", "hardware",
                      "platform")


@pytest.mark.parametrize(("changes", "fields"), [
    pytest.param({"frameworks.torch": "2.1.0", "driver": "550.54.15", "frameworks.cuda": "12.1",
                  "libraries.libcudnn": "libcudnn.so.8.9.2", "frameworks.numpy": "2.1.0",
                  "libraries.libcublas": CUBLAS_OLD},
                 ["frameworks.cuda", "libraries.libcublas", "libraries.libcudnn",
                  "frameworks.torch", "driver", "frameworks.numpy"], id="frameworks"),
    pytest.param({"variables.OMP_NUM_THREADS": "8", "variables.PYTHONHASHSEED": "1",
                  "numerics.tf32_matmul": True, "variables.CUBLAS_WORKSPACE_CONFIG": ":16:8",
                  "numerics.cudnn_benchmark": True},
                 ["variables.CUBLAS_WORKSPACE_CONFIG", "numerics.cudnn_benchmark",
                  "numerics.tf32_matmul", "variables.PYTHONHASHSEED",
                  "variables.OMP_NUM_THREADS"], id="numerics"),
])
def test_priority_within_a_group(changes: dict[str, Any], fields: list[str]) -> None:
    assert [d.field for d in diff_trials(snap(), snap(rank=changes))] == fields


def test_blas_versions_and_threads_are_separate_fields() -> None:
    blas = [{"api": "openmp", "library": "libgomp", "version": None, "threads": 8},
            {"api": "blas", "library": "libopenblas", "version": "0.3.27", "threads": 8}]
    assert rows(diff_trials(snap(), snap(rank={"blas": blas}))) == [
        ("numerics", "blas", ["blas libopenblas 0.3.23", "openmp libgomp"],
         ["blas libopenblas 0.3.27", "openmp libgomp"], 0),
        ("numerics", "blas.threads", ["blas libopenblas 64", "openmp libgomp 64"],
         ["blas libopenblas 8", "openmp libgomp 8"], 0)]


@pytest.mark.parametrize(("a", "b", "expected"), [
    pytest.param(snap(ranks=2, per_rank={1: {"variables.NCCL_ALGO": "Tree"}}), snap(ranks=1),
                 [("config", "ranks", [0, 1], [0], None)], id="fewer-ranks"),
    pytest.param(TrialSnapshots(TRIAL, {}), snap(ranks=2),
                 [("config", "ranks", [], [0, 1], None)], id="run-without-harness"),
    pytest.param(TrialSnapshots(TRIAL, {}), TrialSnapshots(TRIAL, {}), [],
                 id="neither-has-a-harness"),
    pytest.param(snap(ranks=2), snap(ranks=2, per_rank={1: {"frameworks.torch": "2.1.0"}}),
                 [("frameworks", "frameworks.torch", "2.0.1+cu117", "2.1.0", 1)],
                 id="rank-by-rank"),
    pytest.param(snap(ranks=2), snap(ranks=2, rank={"libraries.libcublas": CUBLAS_OLD}),
                 [("frameworks", "libraries.libcublas", CUBLAS_NEW, CUBLAS_OLD, 0),
                  ("frameworks", "libraries.libcublas", CUBLAS_NEW, CUBLAS_OLD, 1)],
                 id="every-rank-in-rank-order"),
])
def test_diff_trials_ranks(a: TrialSnapshots, b: TrialSnapshots, expected: list[Any]) -> None:
    assert rows(diff_trials(a, b)) == expected


def ranks_of(*changes: Mapping[str, Any], first: int = 0) -> dict[int, dict[str, Any]]:
    return {first + i: changed(RANK, change) for i, change in enumerate(changes)}


@pytest.mark.parametrize(("ranks", "expected"), [
    pytest.param({}, [], id="no-ranks"),
    pytest.param(ranks_of({}), [], id="one-rank"),
    pytest.param(ranks_of({}, {}, {"frameworks.torch": "2.1.0"}),
                 [("frameworks", "frameworks.torch", "2.0.1+cu117", "2.1.0", 2)],
                 id="rank-2-differs"),
    pytest.param(ranks_of({"platform.hostname": "gpu-node-01"},
                          {"platform.hostname": "gpu-node-02",
                           "gpus": [{"index": 0, "name": A100, "uuid": "GPU-7777"},
                                    {"index": 1, "name": A100, "uuid": "GPU-6666"}]}),
                 [], id="two-machines"),
    pytest.param(ranks_of({"variables.CUDA_VISIBLE_DEVICES": "0"},
                          {"variables.CUDA_VISIBLE_DEVICES": "1"}),
                 [], id="each-rank-its-own-gpu"),
    pytest.param(ranks_of({"seed.torch_initial": 42}, {"seed.torch_initial": 43},
                          {"seed.torch_initial": 42}),
                 [("numerics", "seed.torch_initial", 42, 43, 1)], id="rank-seeds-reported"),
    pytest.param(ranks_of({}, {"variables.OMP_NUM_THREADS": MISSING}, first=3),
                 [("numerics", "variables.OMP_NUM_THREADS", "1", None, 4)],
                 id="lowest-rank-present-is-the-reference"),
])
def test_diff_ranks(ranks: dict[int, dict[str, Any]], expected: list[Any]) -> None:
    assert rows(diff_ranks(ranks)) == expected


@pytest.mark.parametrize(("difference", "text"), [
    (Difference(DiffGroup.FRAMEWORKS, "frameworks.cuda", "11.7.1", "11.7.0", None),
     "cuda: 11.7.1 vs 11.7.0"),
    (Difference(DiffGroup.FRAMEWORKS, "libraries.libcublas", CUBLAS_OLD, CUBLAS_NEW, 1),
     "libcublas: libcublas.so.11.10.1.25 vs libcublas.so.11.10.3.66 (rank 1)"),
    (Difference(DiffGroup.NUMERICS, "variables.NCCL_ALGO", None, "Ring", 0),
     "NCCL_ALGO: (none) vs Ring (rank 0)"),
    (Difference(DiffGroup.CODE, "code.git.dirty", False, True, None),
     "code.git.dirty: false vs true"),
    (Difference(DiffGroup.CONFIG, "hparams.optimizer.beta1", 0.9, 0.95, None),
     "optimizer.beta1: 0.9 vs 0.95"),
    (Difference(DiffGroup.PACKAGES, "environment.packages.numpy", "1.26.4", None, None),
     "numpy: 1.26.4 vs (none)"),
    (Difference(DiffGroup.FRAMEWORKS, "python.version", "3.11.9", "3.12.3", 0),
     "python.version: 3.11.9 vs 3.12.3 (rank 0)"),
    (Difference(DiffGroup.HARDWARE, "gpus", [A100, A100], ["NVIDIA H100"], 0),
     "gpus: [NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-80GB] vs [NVIDIA H100] (rank 0)"),
    (Difference(DiffGroup.CONFIG, "ranks", [0, 1], [], None), "ranks: [0, 1] vs []"),
])
def test_line(difference: Difference, text: str) -> None:
    assert difference.line() == text


@pytest.mark.parametrize(("group", "relevant"), [
    (DiffGroup.CODE, True), (DiffGroup.CONFIG, True), (DiffGroup.PACKAGES, True),
    (DiffGroup.FRAMEWORKS, True), (DiffGroup.NUMERICS, True), (DiffGroup.HARDWARE, True),
    (DiffGroup.PLATFORM, False),
])
def test_result_relevant(group: DiffGroup, relevant: bool) -> None:
    assert result_relevant(Difference(group, "x", 1, 2, None)) is relevant


def test_a_difference_views_as_the_diff_json_lists_it() -> None:
    differences = diff_trials(snap(), snap(trial={"hparams.lr": 0.1},
                                           rank={"gpus": [{"index": 0, "name": "NVIDIA H100"}]}))
    document = {"differences": [d.view() for d in differences]}
    assert document == {"differences": [
        {"group": "config", "field": "hparams.lr", "a": 0.01, "b": 0.1, "rank": None},
        {"group": "hardware", "field": "gpus", "a": [A100, A100], "b": ["NVIDIA H100"],
         "rank": 0}]}
    assert json.loads(json.dumps(document)) == document


# The outside part (issue 30, item 9): what the server saw of each trial's process.
OUTSIDE: dict[str, Any] = {
    "source": "outside", "attempt": 1, "recorded_at": 1764487282.5,
    "python": {"version": "3.11.9", "implementation": "cpython"},
    "packages": {"numpy": "1.26.4", "torch": "2.0.1", "tinyalpha": "1.0"},
    "code": {"tree_sha256": "9f" * 32, "files": 14}, "unknown": {},
}


def plain(trial: Mapping[str, Any] | None = None,
          outside: Mapping[str, Any] | None = None) -> TrialSnapshots:
    """A trial without the harness: no rank part, an outside part with `outside`'s changes."""
    return TrialSnapshots(trial=changed(TRIAL, trial or {}), ranks={},
                          outside=changed(OUTSIDE, outside or {}))


def with_outside(snapshots: TrialSnapshots, outside: Mapping[str, Any]) -> TrialSnapshots:
    return TrialSnapshots(snapshots.trial, snapshots.ranks, changed(OUTSIDE, outside))


@pytest.mark.parametrize(("a", "b", "expected"), [
    pytest.param(plain(), plain(outside={"attempt": 2, "recorded_at": 1.0,
                                         "code.files": 15}), [], id="only-what-is-not-compared"),
    pytest.param(
        plain(), plain(outside={"packages.tinyalpha": "2.0", "python.version": "3.12.1"}),
        [("packages", "outside.packages.tinyalpha", "1.0", "2.0", None),
         ("frameworks", "outside.python.version", "3.11.9", "3.12.1", None)],
        id="a-layer-package-and-the-interpreter"),
    pytest.param(
        plain(), plain(outside={"python.implementation": "pypy"}),
        [("frameworks", "outside.python.implementation", "cpython", "pypy", None)],
        id="the-implementation"),
    pytest.param(
        plain(), plain(trial={"environment.packages.numpy": "2.1.0"},
                       outside={"packages.numpy": "2.1.0"}),
        [("packages", "environment.packages.numpy", "1.26.4", "2.1.0", None)],
        id="said-once-by-the-trial-part"),
    pytest.param(
        plain(), TrialSnapshots(changed(TRIAL, {}), {}, None),
        [], id="not-recorded-on-one-side"),
    pytest.param(
        with_outside(snap(), {}),
        with_outside(snap(rank={"python.version": "3.12.1"}), {"python.version": "3.12.1"}),
        [("frameworks", "python.version", "3.11.9", "3.12.1", 0)],
        id="the-harness-wins"),
    pytest.param(
        plain(), with_outside(snap(), {"python.version": "3.12.1"}),
        [("config", "ranks", [], [0], None),
         ("frameworks", "outside.python.version", "3.11.9", "3.12.1", None)],
        id="plain-against-harness"),
])
def test_diff_trials_outside(a: TrialSnapshots, b: TrialSnapshots, expected: list[Any]) -> None:
    assert rows(diff_trials(a, b)) == expected


def test_an_outside_line_says_where_it_was_seen() -> None:
    found = diff_trials(plain(), plain(outside={"packages.tinyalpha": MISSING,
                                                "python.version": "3.12.1"}))
    assert [d.line() for d in found] == [
        "tinyalpha: 1.0 vs (none) (seen from outside)",
        "python.version: 3.11.9 vs 3.12.1 (seen from outside)"]
    assert found[0].view() == {
        "group": "packages", "field": "outside.packages.tinyalpha", "a": "1.0", "b": None,
        "rank": None}
