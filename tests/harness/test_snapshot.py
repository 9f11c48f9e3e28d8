"""The rank part of the reproducibility snapshot (`muster.harness.snapshot`, issue 17)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_type_hints, is_typeddict

import pytest

from muster.harness.snapshot import (
    RankPart,
    capture,
    loaded_libraries,
    numerics_variables,
    write,
)

OPTIONAL_STR = (str, type(None))
# The rank part of muster.diagnostics' schema: each key and the types its value may have.
SCHEMA: dict[str, Any] = {
    "python": {"version": str, "implementation": str},
    "platform": {"system": str, "release": str, "machine": str, "hostname": str,
                 "cpu": OPTIONAL_STR},
    "frameworks": dict.fromkeys(("torch", "cuda", "cudnn", "nccl", "numpy"), OPTIONAL_STR),
    "driver": OPTIONAL_STR,
    "gpus": list,
    "libraries": dict,
    "packages": dict,
    "numerics": {**dict.fromkeys(("tf32_matmul", "tf32_cudnn", "cudnn_benchmark",
                                  "cudnn_deterministic", "deterministic_algorithms"),
                                 (bool, type(None))),
                 "float32_matmul_precision": OPTIONAL_STR},
    "blas": list,
    "variables": dict,
    "seed": {"torch_initial": (int, type(None))},
}
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")

MAPS_NOISE = """\
55d0c0800000-55d0c0a21000 r-xp 00000000 08:01 131090                     /usr/bin/python3.11
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f3c2a000000-7f3c2a021000 rw-p 00000000 00:00 0 
7f3c2b000000-7f3c2b200000 r-xp 00028000 08:01 1048601    /usr/lib/x86_64-linux-gnu/libc.so.6
7ffd1c5f1000-7ffd1c5f3000 r-xp 00000000 00:00 0                          [vdso]
"""  # noqa: W291 (an anonymous map's line ends in a space)


def maps_line(path: str | Path, perms: str = "r-xp") -> str:
    return f"7f3c30000000-7f3c30200000 {perms} 00000000 08:01 2097153    {path}\n"


def cuda_maps(cublas_version: str) -> str:
    """A process that loaded CUDA 11's cuBLAS `cublas_version` and cuDNN 8.9.2."""
    lib = "/usr/local/cuda/lib64"
    return (MAPS_NOISE
            + maps_line(f"{lib}/libcublas.so.{cublas_version}", "r--p")
            + maps_line(f"{lib}/libcublas.so.{cublas_version}")
            + maps_line(f"{lib}/libcublasLt.so.11.10.1.25")
            + maps_line("/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.2"))


def check_schema(value: Any, schema: Any, where: str = "snapshot") -> None:
    if isinstance(schema, dict):
        assert isinstance(value, dict), where
        assert set(value) == set(schema), where
        for key, part in schema.items():
            check_schema(value[key], part, f"{where}.{key}")
    else:
        assert isinstance(value, schema), f"{where} = {value!r}"


def captured_in_a_new_process(prelude: str) -> dict[str, Any]:
    """`capture()` in a fresh interpreter after `prelude`, and which modules it then had."""
    code = (f"{prelude}\n"
            "import json, sys\n"
            "from muster.harness.snapshot import capture\n"
            "snapshot = capture()\n"
            "torch = sys.modules.get('torch')\n"
            "print(json.dumps({'snapshot': snapshot, 'modules': sorted(sys.modules),\n"
            "    'cuda_initialized': torch.cuda.is_initialized() if torch else None,\n"
            "    'torch_cuda': torch.version.cuda if torch else None}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_capture_has_every_field_of_the_schema() -> None:
    snapshot = capture()
    check_schema(snapshot, SCHEMA)
    assert snapshot["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert all(isinstance(name, str) and isinstance(version, str)
               for name, version in snapshot["packages"].items())


def test_the_schema_is_the_rank_parts_type() -> None:
    def keys(shape: type) -> dict[str, Any]:
        return {name: keys(hint) if is_typeddict(hint) else None
                for name, hint in get_type_hints(shape).items()}

    def schema_keys(schema: dict[str, Any]) -> dict[str, Any]:
        return {name: schema_keys(part) if isinstance(part, dict) else None
                for name, part in schema.items()}

    assert keys(RankPart) == schema_keys(SCHEMA)


@needs_torch
def test_with_torch_imported_its_fields_are_filled_without_starting_cuda() -> None:
    probe = captured_in_a_new_process(
        "import torch\ntry:\n    import threadpoolctl\nexcept ImportError:\n    pass")
    snapshot = probe["snapshot"]
    check_schema(snapshot, SCHEMA)
    from importlib.metadata import version
    assert snapshot["frameworks"]["torch"] == version("torch")
    assert snapshot["packages"]["torch"] == version("torch")
    assert snapshot["frameworks"]["cuda"] == probe["torch_cuda"]
    assert snapshot["frameworks"]["numpy"] is not None  # torch imports numpy
    assert snapshot["gpus"] == []
    assert probe["cuda_initialized"] is False
    numerics = snapshot["numerics"]
    assert all(isinstance(numerics[key], bool) for key in numerics
               if key != "float32_matmul_precision")
    assert numerics["float32_matmul_precision"] in ("highest", "high", "medium")
    assert isinstance(snapshot["seed"]["torch_initial"], int)
    if "threadpoolctl" in probe["modules"]:
        assert snapshot["blas"] != []
        for pool in snapshot["blas"]:
            check_schema(pool, {"api": str, "library": str, "version": OPTIONAL_STR,
                                "threads": int})


def test_without_torch_imported_the_capture_imports_nothing_heavy() -> None:
    probe = captured_in_a_new_process("")
    snapshot = probe["snapshot"]
    check_schema(snapshot, SCHEMA)
    assert set(probe["modules"]) & {"torch", "numpy", "threadpoolctl"} == set()
    assert set(snapshot["frameworks"].values()) == {None}
    assert set(snapshot["numerics"].values()) == {None}
    assert snapshot["seed"] == {"torch_initial": None}
    assert snapshot["gpus"] == []
    assert snapshot["blas"] == []
    if HAS_TORCH:
        assert "torch" in snapshot["packages"]  # installed, though not imported


def test_two_cublas_versions_differ_only_in_libcublas(tmp_path: Path) -> None:
    captured = []
    for version in ("11.10.1.25", "11.10.3.66"):
        maps = tmp_path / f"maps-{version}"
        maps.write_text(cuda_maps(version))
        captured.append(capture(environ={}, maps_path=str(maps))["libraries"])
    old, new = captured
    assert old == {"libcublas": "libcublas.so.11.10.1.25",
                   "libcublasLt": "libcublasLt.so.11.10.1.25",
                   "libcudnn": "libcudnn.so.8.9.2"}
    assert {**old, "libcublas": "libcublas.so.11.10.3.66"} == new


def test_a_library_mapped_through_a_link_is_recorded_as_the_file_it_names(
        tmp_path: Path) -> None:
    (tmp_path / "libnccl.so.2.18.1").write_bytes(b"\x7fELF")
    (tmp_path / "libnccl.so.2").symlink_to("libnccl.so.2.18.1")
    maps = tmp_path / "maps"
    maps.write_text(MAPS_NOISE + maps_line(tmp_path / "libnccl.so.2"))
    assert capture(environ={}, maps_path=str(maps))["libraries"] == {
        "libnccl": "libnccl.so.2.18.1"}


@pytest.mark.parametrize(("paths", "expected"), [
    ([], {}),
    (["/opt/lib/libcublasLt.so.12"], {"libcublasLt": "libcublasLt.so.12"}),
    (["/torch/lib/libcudart-d0da41ae.so.11.0", "/torch/lib/libtorch_cuda.so",
      "/torch/lib/libtorch_cpu.so", "/torch/lib/libgomp-a34b3233.so.1"],
     {"libcudart": "libcudart-d0da41ae.so.11.0", "libtorch_cuda": "libtorch_cuda.so",
      "libgomp": "libgomp-a34b3233.so.1"}),
    (["/b/libcudnn.so.8.9.2", "/a/libcudnn.so.8.6.0", "/b/libcudnn.so.8.9.2"],
     {"libcudnn": "libcudnn.so.8.6.0, libcudnn.so.8.9.2"}),
    (["/gone/libnccl.so.2.18.1 (deleted)"], {"libnccl": "libnccl.so.2.18.1"}),
    (["/my libs/libopenblas.so.0"], {"libopenblas": "libopenblas.so.0"}),
    (["/usr/lib/libcublasfoo.so", "/usr/lib/libmkl_rt.so.2", "/usr/lib/libiomp5.so"],
     {"libmkl_rt": "libmkl_rt.so.2", "libiomp5": "libiomp5.so"}),
])
def test_loaded_libraries(paths: list[str], expected: dict[str, str]) -> None:
    assert loaded_libraries([*MAPS_NOISE.splitlines(True), *map(maps_line, paths)]) == expected


def test_an_unreadable_memory_map_records_no_libraries(tmp_path: Path) -> None:
    assert capture(environ={}, maps_path=str(tmp_path / "missing"))["libraries"] == {}


def test_only_allow_listed_variables_are_recorded_and_never_a_secret() -> None:
    environ = {
        "PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "4",
        "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_ALGO": "Ring",
        "NCCL_IB_SECRET_KEY": "hunter2", "NCCL_AUTH_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
        "WANDB_API_KEY": "k", "HF_TOKEN": "h", "PATH": "/usr/bin", "HOME": "/root",
        "nccl_debug": "INFO", "MUSTER_RUN_DIR": "/runs/1",
    }
    assert capture(environ=environ)["variables"] == {
        "PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "4",
        "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_ALGO": "Ring"}


def test_the_variables_come_from_this_process_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    monkeypatch.setenv("HF_TOKEN", "h")
    recorded = capture()["variables"]
    assert recorded["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert recorded == numerics_variables(os.environ)
    assert "HF_TOKEN" not in recorded


def test_the_packages_are_torch_numpy_and_nvidia_wheels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, version in [("nvidia-cublas-cu12", "12.1.3.1"), ("requests", "2.31.0")]:
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    packages = capture(environ={})["packages"]
    assert packages["nvidia-cublas-cu12"] == "12.1.3.1"
    assert "requests" not in packages
    assert all(name in ("torch", "numpy") or name.lower().startswith("nvidia")
               for name in packages)


def broken(*args: object) -> Any:
    raise RuntimeError("CUDA error: no CUDA-capable device is detected")


def fake_torch(*, cuda_initialized: bool) -> SimpleNamespace:
    """What a CUDA build of torch shows the capture, with one GPU whose name fails."""
    cudnn = SimpleNamespace(is_available=lambda: True, version=lambda: 8902,
                            allow_tf32=True, benchmark=True, deterministic=False)
    cuda = SimpleNamespace(
        is_initialized=lambda: cuda_initialized, device_count=lambda: 2,
        get_device_name=lambda index: broken() if index == 1 else "NVIDIA H100 80GB HBM3",
        get_device_properties=lambda index: SimpleNamespace(uuid=f"uuid-{index}"),
        nccl=SimpleNamespace(version=lambda: (2, 18, 1)))
    return SimpleNamespace(
        __version__="2.1.0+cu121", version=SimpleNamespace(cuda="12.1"), cuda=cuda,
        backends=SimpleNamespace(cudnn=cudnn,
                                 cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=False))),
        are_deterministic_algorithms_enabled=lambda: True,
        get_float32_matmul_precision=broken, initial_seed=lambda: 42)


def test_a_cuda_torch_is_read_and_what_fails_is_null(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU cannot exist here: a fake torch stands in for a CUDA build on a sick machine."""
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda_initialized=True))
    snapshot = capture(environ={})
    check_schema(snapshot, SCHEMA)
    frameworks = {**snapshot["frameworks"], "numpy": None}
    assert frameworks == {"torch": "2.1.0+cu121", "cuda": "12.1", "cudnn": "8902",
                          "nccl": "2.18.1", "numpy": None}
    assert snapshot["gpus"] == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "uuid-0"},
                                {"index": 1, "name": None, "uuid": "uuid-1"}]
    assert snapshot["numerics"] == {
        "tf32_matmul": False, "tf32_cudnn": True, "cudnn_benchmark": True,
        "cudnn_deterministic": False, "deterministic_algorithms": True,
        "float32_matmul_precision": None}
    assert snapshot["seed"] == {"torch_initial": 42}


def test_gpus_are_not_asked_for_before_the_script_starts_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch = fake_torch(cuda_initialized=False)
    torch.cuda.device_count = torch.cuda.get_device_name = torch.cuda.get_device_properties = (
        lambda *args: pytest.fail("asked CUDA about devices before it was initialized"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    snapshot = capture(environ={})
    assert snapshot["gpus"] == []
    assert snapshot["frameworks"]["nccl"] == "2.18.1"  # NCCL's version needs no device


def test_write_stores_the_snapshot_as_json(tmp_path: Path) -> None:
    snapshot = capture(environ={"PYTHONHASHSEED": "0"})
    write(tmp_path / "snapshot.json", snapshot)
    assert json.loads((tmp_path / "snapshot.json").read_text()) == snapshot
    assert [path.name for path in tmp_path.iterdir()] == ["snapshot.json"]
