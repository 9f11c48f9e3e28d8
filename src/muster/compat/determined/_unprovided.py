"""What muster's `determined` does not provide, said once, with why and what to do instead.

A call muster cannot serve raises `NotImplementedError` from `unprovided()`; a part of
Determined's package that is not here fails to import (or to be read as an attribute of
`determined`) with the reason from `MODULES`, rather than "No module named ...".
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

GUIDE = "docs/how-to/coming-from-determined.md"
_CORE_ONLY = "muster serves Determined's Core API (determined.core) only"
_SCRIPT = "write a training script with det.core.init() instead"

# Determined's modules that have no counterpart here, by name under `determined`.
MODULES: dict[str, str] = {
    "pytorch": f"{_CORE_ONLY}: PyTorchTrial and det.pytorch.Trainer are not provided; {_SCRIPT}",
    "keras": f"{_CORE_ONLY}: TFKerasTrial is not provided; {_SCRIPT}",
    "transformers": f"{_CORE_ONLY}: DetCallback is not provided; muster attaches its own "
                    "Hugging Face callback (`integrations: auto`)",
    "lightning": f"{_CORE_ONLY}: muster attaches its own Lightning callback "
                 "(`integrations: auto`)",
    "horovod": f"{_CORE_ONLY}: Horovod is not supported; train with torch.distributed",
    "experimental": f"{_CORE_ONLY}: the Python SDK talks to a Determined master, and a "
                    "muster trial has none; use muster's CLI or HTTP API from outside the trial",
    "tensorboard": f"{_CORE_ONLY}: muster does not collect TensorBoard files",
    "common": f"{_CORE_ONLY}: determined.common (the master's API client, storage managers) "
              "talks to a Determined master, and a muster trial has none",
    "util": f"{_CORE_ONLY}: determined.util is Determined's internal helpers",
    "launch.deepspeed": "muster starts one process per rank itself; run the DeepSpeed "
                        "script directly (its ranks get torchrun's variables)",
    "launch.horovod": "Horovod is not supported; train with torch.distributed",
    "launch.tensorflow": "TensorFlow's launcher is not provided; run the script directly",
    "launch.wrap_rank": "muster keeps each rank's log apart already; run the script directly",
}


def unprovided(call: str, why: str) -> NotImplementedError:
    """The error for a Determined call muster does not serve: what, why, where to read more."""
    return NotImplementedError(f"{call} is not supported by muster's Determined Core API: "
                               f"{why} (see {GUIDE})")


def missing_attribute(package: str, name: str) -> AttributeError:
    """The error for `det.<name>` where `name` is one of `MODULES`, else a plain one."""
    why = MODULES.get(name)
    if why is None:
        return AttributeError(f"module {package!r} has no attribute {name!r}")
    return AttributeError(f"{package}.{name} is not provided by muster: {why} (see {GUIDE})")


class UnprovidedModules(importlib.abc.MetaPathFinder):
    """Last on `sys.meta_path`: a module under the package that nothing else found raises
    `ImportError` with its reason from `MODULES`."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        prefix = f"{self.package}."
        if not fullname.startswith(prefix):
            return None
        name = fullname.removeprefix(prefix)
        why = MODULES.get(name) or MODULES.get(name.split(".")[0]) or _CORE_ONLY
        raise ImportError(f"{fullname} is not provided by muster: {why} (see {GUIDE})",
                          name=fullname)


def install_finder(package: str) -> None:
    """Append an `UnprovidedModules` for `package` to `sys.meta_path`, once."""
    if not any(isinstance(f, UnprovidedModules) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(UnprovidedModules(package))
