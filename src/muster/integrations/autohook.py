"""`integrations: auto`: the framework's callback, attached when the framework is imported.

`install()` (run by `muster.startup` in every process of a trial that has integrations
on) puts a finder first on `sys.meta_path` that watches for the modules defining the
frameworks' trainers. When one of them has been executed, the integration's `attach`
patches that module's trainer so that each new one carries muster's callback (unless the
script gave it one itself). Until then nothing of the framework, nor of muster's
integration, is imported: a script that never imports a framework pays one dictionary
lookup per import.

The hook must never break a script: an error while finding or attaching is one line on
stderr, and the module loads as it would have without muster.
"""

from __future__ import annotations

import importlib
import sys

# Not `typing.TYPE_CHECKING`: importing `typing` costs a trial's every process ~10 ms, and
# mypy reads any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:  # every process of a trial imports this module: only what it runs on
    from collections.abc import Callable, Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    _Loader = Loader
else:
    _Loader = object

__all__ = ["TARGETS", "install"]

# The module that defines a framework's trainer -> (integration module, its attach function).
TARGETS: dict[str, tuple[str, str]] = {
    "lightning.pytorch.trainer.trainer": ("muster.integrations.lightning", "attach"),
    "pytorch_lightning.trainer.trainer": ("muster.integrations.lightning", "attach"),
    "transformers.trainer": ("muster.integrations.transformers", "attach"),
}


class _Finder:
    """Finds nothing itself: for a target module it asks the finders after it, and hands
    back their spec with a loader that attaches the integration once the module ran.

    A meta path finder and a loader by their methods, not by `importlib.abc`'s classes:
    importing `importlib.abc` imports `importlib.resources`, `pathlib`, `tempfile` and
    `typing`, ~28 ms added to the start of every Python process of a trial."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in TARGETS:
            return None
        try:
            spec = _spec_from_others(self, fullname, path, target)
        except Exception as exc:  # noqa: BLE001 - the module is then found without muster
            _say(f"finding {fullname}", exc)
            return None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _AttachingLoader(spec.loader, fullname)
        return spec


class _AttachingLoader(_Loader):
    """The framework's loader, and then the integration's `attach` on the loaded module."""

    def __init__(self, loader: Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        integration, function = TARGETS[self._name]
        try:
            attach: Callable[[ModuleType], None] = getattr(
                importlib.import_module(integration), function)
            attach(module)
        except Exception as exc:  # noqa: BLE001 - the script runs as without the hook
            _say(f"attaching {integration} to {self._name}", exc)

    def __getattr__(self, name: str) -> Any:
        # get_source, is_package, get_resource_reader...: the framework's loader answers.
        return getattr(self._loader, name)


def _spec_from_others(finder: _Finder, fullname: str, path: Sequence[str] | None,
                      target: ModuleType | None) -> ModuleSpec | None:
    for other in sys.meta_path:
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec: ModuleSpec | None = other.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _say(doing: str, exc: BaseException) -> None:
    print(f"muster: integrations: {doing} failed ({type(exc).__name__}: {exc}); the script "
          "runs without muster's callback", file=sys.stderr, flush=True)


def install() -> None:
    """Put the finder first on `sys.meta_path` (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
