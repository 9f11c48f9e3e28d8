"""The rank part of a reproducibility snapshot (issue 17): what this process runs on.

`capture()` returns it in the shape `muster.diagnostics` describes; `write()` stores it.
Standard library only, and cheap (milliseconds): torch, numpy and threadpoolctl are read
only when the training script already imported them, never imported here. CUDA is read
only once the script initialized it (`torch.cuda.is_initialized()`): asking earlier costs
the driver's start-up and makes a later `fork` unable to use CUDA. So a capture at `init()`
may leave the CUDA fields null and `[]`; the capture when the context ends fills them.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from muster.atomic import atomic_write_json

__all__ = ["LIBRARY_FAMILIES", "NUMERICS_VARIABLES", "RankPart", "capture",
           "loaded_libraries", "numerics_variables", "write"]

# Exact names, and prefixes ending in "*". They change numerics, so two runs that differ
# in them may differ in their results.
NUMERICS_VARIABLES = (
    "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_TF32_OVERRIDE", "TORCH_CUDNN_V8_API_ENABLED", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TORCH_DISTRIBUTED_DEBUG", "KMP_AFFINITY", "KMP_BLOCKTIME", "NCCL_*",
)
_EXACT = frozenset(name for name in NUMERICS_VARIABLES if not name.endswith("*"))
_PREFIXES = tuple(name[:-1] for name in NUMERICS_VARIABLES if name.endswith("*"))
# A snapshot is shown to everyone who can read the trial: these never go into one.
_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", re.IGNORECASE)

# Shared libraries whose version changes numerics, by the start of their file names.
LIBRARY_FAMILIES = (
    "libcublas", "libcublasLt", "libcudnn", "libnccl", "libcudart", "libcufft", "libcurand",
    "libcusparse", "libnvrtc", "libtorch_cuda", "libopenblas", "libmkl_rt", "libgomp",
    "libiomp5",
    "libscipy_openblas64_", "libscipy_openblas",  # numpy 2's own OpenBLAS (wheels)
)
_LIBRARY = re.compile(rf"({'|'.join(LIBRARY_FAMILIES)})[.-]")

_DISTRIBUTION_SUFFIXES = (".dist-info", ".egg-info")
_DRIVER_VERSION = re.compile(r"\s(\d+\.\d+(?:\.\d+)*)\s")
# What a half-working torch raises when asked about CUDA (a CPU build asserts).
_TORCH_ERRORS = (AttributeError, AssertionError, ImportError, OSError, RuntimeError,
                 TypeError, ValueError)

_T = TypeVar("_T")


class Interpreter(TypedDict):
    version: str | None  # None: not known (the outside part's, when its probe failed)
    implementation: str | None


class Machine(TypedDict):
    system: str
    release: str
    machine: str
    hostname: str
    cpu: str | None


class Frameworks(TypedDict):
    torch: str | None
    cuda: str | None
    cudnn: str | None
    nccl: str | None
    numpy: str | None


class Gpu(TypedDict):
    index: int
    name: str | None
    uuid: str | None


class Numerics(TypedDict):
    tf32_matmul: bool | None
    tf32_cudnn: bool | None
    cudnn_benchmark: bool | None
    cudnn_deterministic: bool | None
    deterministic_algorithms: bool | None
    float32_matmul_precision: str | None


class BlasPool(TypedDict):
    """A thread pool threadpoolctl sees."""

    api: str | None
    library: str
    version: str | None
    threads: int | None


class Seed(TypedDict):
    torch_initial: int | None


class RankPart(TypedDict):
    """The rank part of a snapshot (`muster.diagnostics`): every field a process cannot know
    is null, never missing. Its readers take it as unchecked JSON: a script may write
    anything to the file, and an older harness wrote less."""

    python: Interpreter
    platform: Machine
    frameworks: Frameworks
    driver: str | None
    gpus: list[Gpu]  # [] until CUDA is initialized
    libraries: dict[str, str]  # library family → its loaded file(s)
    packages: dict[str, str]  # the torch, numpy and nvidia-* distributions → version
    numerics: Numerics
    blas: list[BlasPool]
    variables: dict[str, str]  # the allow-listed numerics variables that are set
    seed: Seed


def capture(environ: Mapping[str, str] | None = None,
            maps_path: str = "/proc/self/maps") -> RankPart:
    """The rank part of the snapshot, as `muster.diagnostics` describes it.

    Args:
        environ: where to read the numerics variables; `os.environ` by default.
        maps_path: this process's memory map, where the loaded libraries are found.
    """
    torch: Any = sys.modules.get("torch")
    cuda = torch is not None and _read(lambda: bool(torch.cuda.is_initialized())) is True
    return RankPart(
        python=Interpreter(version=platform.python_version(),
                           implementation=platform.python_implementation()),
        platform=Machine(system=platform.system(), release=platform.release(),
                         machine=platform.machine(), hostname=socket.gethostname(),
                         cpu=_cpu_model()),
        frameworks=_frameworks(torch),
        driver=_driver_version(),
        gpus=_gpus(torch) if cuda else [],
        libraries=loaded_libraries(_read_lines(maps_path)),
        packages=_packages(),
        numerics=_numerics(torch),
        blas=_blas(),
        variables=numerics_variables(os.environ if environ is None else environ),
        seed=Seed(torch_initial=None if torch is None
                  else _read(lambda: int(torch.initial_seed()))),
    )


def write(path: Path, snapshot: RankPart) -> None:
    """Store `snapshot` at `path` as JSON, atomically (`muster.atomic`)."""
    atomic_write_json(path, snapshot)


def numerics_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed variables set in `environ`, less any name that looks secret."""
    return {name: value for name, value in sorted(environ.items())
            if (name in _EXACT or name.startswith(_PREFIXES)) and not _SECRET.search(name)}


def loaded_libraries(maps_lines: Iterable[str]) -> dict[str, str]:
    """Each library family's loaded file (several: sorted, joined by ", "), from the lines
    of /proc/<pid>/maps; a family not loaded is left out."""
    found: dict[str, set[str]] = {}
    for path in {path for line in maps_lines if (path := _mapped_path(line))}:
        match = _LIBRARY.match(os.path.basename(path))
        if match:
            # The kernel names a file that is gone as mapped; realpath leaves it so.
            found.setdefault(match.group(1), set()).add(
                os.path.basename(os.path.realpath(path)))
    return {family: ", ".join(sorted(files)) for family, files in sorted(found.items())}


def _mapped_path(line: str) -> str | None:
    """The file a maps line maps ("addr perms offset dev inode path"), or None."""
    fields = line.rstrip("\n").split(maxsplit=5)
    if len(fields) < 6 or not fields[5].startswith("/"):
        return None
    return fields[5].removesuffix(" (deleted)")


def _read(get: Callable[[], _T]) -> _T | None:
    """`get()`, or None when torch (or CUDA under it) cannot say."""
    try:
        return get()
    except _TORCH_ERRORS:
        return None


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.readlines()
    except OSError:
        return []


def _cpu_model() -> str | None:
    for line in _read_lines("/proc/cpuinfo"):
        name, _, value = line.partition(":")
        if name.strip() == "model name":
            return value.strip()
    return None


def _driver_version() -> str | None:
    """The NVIDIA kernel module's version, e.g. "535.104.05"; None without one."""
    lines = _read_lines("/proc/driver/nvidia/version")
    match = _DRIVER_VERSION.search(lines[0]) if lines else None
    return match.group(1) if match else None


def _frameworks(torch: Any) -> Frameworks:
    numpy: Any = sys.modules.get("numpy")
    numpy_version = _read(lambda: str(numpy.__version__)) if numpy else None
    if torch is None:
        return Frameworks(torch=None, cuda=None, cudnn=None, nccl=None, numpy=numpy_version)
    cudnn = torch.backends.cudnn if _read(lambda: torch.backends.cudnn.is_available()) else None
    return Frameworks(
        torch=_read(lambda: str(torch.__version__)),
        cuda=_read(lambda: _optional_str(torch.version.cuda)),
        cudnn=_read(lambda: _optional_str(cudnn.version())) if cudnn else None,
        # NCCL's own version call; it needs no CUDA device (a CPU build has no NCCL).
        nccl=_read(lambda: _version_text(torch.cuda.nccl.version())),
        numpy=numpy_version,
    )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _version_text(version: object) -> str:
    """NCCL's version as "2.18.1" (torch gives a tuple; before 1.10 an int)."""
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version)
    return str(version)


def _gpus(torch: Any) -> list[Gpu]:
    count = _read(lambda: int(torch.cuda.device_count())) or 0
    return [_gpu(torch, index) for index in range(count)]


def _gpu(torch: Any, index: int) -> Gpu:
    return Gpu(index=index,
               name=_read(lambda: str(torch.cuda.get_device_name(index))),
               uuid=_read(lambda: _optional_str(
                   getattr(torch.cuda.get_device_properties(index), "uuid", None))))


def _numerics(torch: Any) -> Numerics:
    if torch is None:
        return Numerics(tf32_matmul=None, tf32_cudnn=None, cudnn_benchmark=None,
                        cudnn_deterministic=None, deterministic_algorithms=None,
                        float32_matmul_precision=None)
    return Numerics(
        tf32_matmul=_read(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        tf32_cudnn=_read(lambda: bool(torch.backends.cudnn.allow_tf32)),
        cudnn_benchmark=_read(lambda: bool(torch.backends.cudnn.benchmark)),
        cudnn_deterministic=_read(lambda: bool(torch.backends.cudnn.deterministic)),
        deterministic_algorithms=_read(
            lambda: bool(torch.are_deterministic_algorithms_enabled())),
        float32_matmul_precision=_read(lambda: str(torch.get_float32_matmul_precision())),
    )


def _blas() -> list[BlasPool]:
    """The thread pools threadpoolctl sees, when the script imported it."""
    threadpoolctl: Any = sys.modules.get("threadpoolctl")
    pools = _read(threadpoolctl.threadpool_info) if threadpoolctl else None
    return [BlasPool(api=pool.get("internal_api"),
                     library=os.path.basename(pool.get("filepath") or ""),
                     version=pool.get("version"), threads=pool.get("num_threads"))
            for pool in pools or []]


def _packages() -> dict[str, str]:
    """Versions of the installed torch, numpy and nvidia-* distributions.

    Only their metadata is read: a directory listing of each `sys.path` entry picks them
    out by name, where `importlib.metadata.distributions()` would read every package's
    (30-100 ms in a big environment). The first found wins, as in an import.
    """
    from importlib import metadata  # 15 ms to import: paid here, not by `import muster.harness`

    versions: dict[str, str] = {}
    for entry in sys.path:
        for candidate in _distribution_dirs(entry or "."):
            distribution = metadata.Distribution.at(candidate)
            name, version = distribution.name, distribution.version
            if name and version and _is_recorded(name):
                versions.setdefault(name, version)
    return dict(sorted(versions.items()))


def _distribution_dirs(directory: str) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            return [entry.path for entry in entries
                    if entry.name.endswith(_DISTRIBUTION_SUFFIXES) and _may_be_recorded(entry.name)]
    except OSError:  # gone, not a directory, or a zip file
        return []


def _may_be_recorded(directory_name: str) -> bool:
    """Whether "torch-2.3.0.dist-info", "nvidia_nccl_cu12-2.18.1.dist-info" and the like
    can hold a recorded distribution; its metadata's name decides."""
    stem = directory_name.lower()
    return stem.startswith("nvidia") or stem.partition("-")[0].partition(".")[0] in (
        "torch", "numpy")


def _is_recorded(name: str) -> bool:
    normal = re.sub(r"[-_.]+", "-", name).lower()
    return normal in ("torch", "numpy") or normal.startswith("nvidia-")
