"""The two changes an integration makes to a framework's trainer class, once per class.

- `after_init`: every trainer the class makes gets `add(trainer)` after its own `__init__`
  (the import hook's: muster's callback, unless the script gave it one). A failure of `add`
  is one line on stderr; the trainer is left as the script made it.
- `resuming`: the training method (`fit`, `train`) called without a checkpoint argument
  gets muster's latest checkpoint as that argument, where `find(trainer)` names one (it
  does only for a trainer that carries muster's callback).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["after_init", "resuming"]

_WRAPPED = "__muster_wrapped__"


def after_init(trainer_class: type, add: Callable[[Any], None]) -> None:
    """Wrap `trainer_class.__init__` to call `add(trainer)` after it (once per class)."""
    init = getattr(trainer_class, "__init__")  # noqa: B009 - the class's, not an instance's
    if getattr(init, _WRAPPED, False):
        return

    @functools.wraps(init)
    def init_then_add(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            add(self)
        except Exception as exc:  # noqa: BLE001 - the rule: never break the script
            print(f"muster: integrations: adding muster's callback to the "
                  f"{type(self).__name__} failed ({type(exc).__name__}: {exc}); it trains "
                  "without it", file=sys.stderr, flush=True)

    setattr(init_then_add, _WRAPPED, True)
    setattr(trainer_class, "__init__", init_then_add)  # noqa: B010 - a method, replaced


def resuming(trainer_class: type, method: str, argument: str, position: int,
             find: Callable[[Any], str | None]) -> None:
    """Wrap `trainer_class.<method>` so that a call that gives `argument` neither by keyword
    nor positionally (its `position`-th argument after self, from 0) gets `find(trainer)`
    when that names a checkpoint (once per class)."""
    original = getattr(trainer_class, method)
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def with_muster_checkpoint(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) <= position and kwargs.get(argument) is None:
            path = find(self)
            if path is not None:
                kwargs[argument] = path
        return original(self, *args, **kwargs)

    setattr(with_muster_checkpoint, _WRAPPED, True)
    setattr(trainer_class, method, with_muster_checkpoint)
