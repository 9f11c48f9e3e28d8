"""`reproducibility.deterministic: true`, in the training process (MUSTER_DETERMINISTIC=1).

`init()` calls `apply` before the training code runs: Python's `random` and NumPy's global
generator are seeded from MUSTER_SEED plus the rank (ranks draw different augmentations),
torch's from MUSTER_SEED alone (every rank builds the same initial model), torch's
deterministic algorithms are required (an operation without one raises, naming it), and
cuDNN picks deterministic kernels without benchmarking. PYTHONHASHSEED and
CUBLAS_WORKSPACE_CONFIG are set by muster in the environment, before the interpreter and
CUDA start. NumPy and torch are imported here when installed (about a second for torch,
paid once at start: part of the documented cost).
"""

from __future__ import annotations

import importlib
import importlib.util
import random
from typing import Any

__all__ = ["apply"]


def apply(seed: int | None, rank: int) -> list[str]:
    """Seed and switch to deterministic numerics; what was done, in words."""
    base = 0 if seed is None else seed
    random.seed(base + rank)
    done = [f"random.seed({base + rank})"]
    numpy = _module("numpy")
    if numpy is not None:
        numpy.random.seed((base + rank) % 2**32)
        done.append(f"numpy.random.seed({(base + rank) % 2**32})")
    torch = _module("torch")
    if torch is not None:
        torch.manual_seed(base)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        done += [f"torch.manual_seed({base})", "torch.use_deterministic_algorithms(True)",
                 "cudnn.deterministic=True", "cudnn.benchmark=False"]
    return done


def _module(name: str) -> Any:
    """The module when it is installed (imported now if it was not), else None."""
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)
