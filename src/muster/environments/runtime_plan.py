"""What the runtime base holds: the pure half (`runtime_base` builds and publishes it).

A trial without an `environment:` block used to import everything installed where muster
runs: muster's server (FastAPI, SQLAlchemy, uvicorn), its tests (pytest, hypothesis) and
its CLI's (Typer and Rich: what a training script imports must not depend on what muster's
CLI happens to use). The runtime base is that installation less muster's own dependencies:

    included = installed - (server - training) - {muster}

`server` is the closure of muster's requirements (its core and every extra but the
training ones: `dev`, `ray`, ...); `training` the closure of `TRAINING_PACKAGES` and of
muster's training extras (`examples`). What training code uses stays even where muster
needs it too (numpy is Optuna's, jinja2 torch's); what nobody asked for (pip, a package an
admin installed) stays as well.

The base's site-packages is a directory of links (`link_plan`): one per top-level entry
of each included distribution, from its RECORD, so that `import torch` finds torch and
`import fastapi` finds nothing. A top-level directory that included and excluded
distributions share (a namespace package, `__pycache__`) becomes a real directory holding
links to the included ones' entries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement

__all__ = ["OWN_DISTRIBUTION", "SERVER_EXTRAS_EXCEPT", "TRAINING_PACKAGES", "DistFacts",
           "closure", "included_distributions", "link_plan", "normalize"]

OWN_DISTRIBUTION = "muster"
# What training code imports, kept with everything it needs (whatever of it is installed):
# the frameworks, their data and model hubs, and the small tools scripts use beside them
# (progress bars and YAML configs: Lightning, transformers and accelerate need both).
TRAINING_PACKAGES = (
    "torch", "torchvision", "torchaudio", "torchtext", "torchmetrics", "numpy", "scipy",
    "scikit-learn", "pandas", "pillow", "matplotlib", "lightning", "pytorch-lightning",
    "transformers", "accelerate", "datasets", "tokenizers", "safetensors", "huggingface-hub",
    "evaluate", "peft", "timm", "sentencepiece", "tiktoken", "einops", "tensorboard", "tqdm",
    "pyyaml",
)
# muster's extras whose packages are for training code, not for muster: kept.
SERVER_EXTRAS_EXCEPT = ("examples",)


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares them: `PyYAML` and `pyyaml` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class DistFacts:
    """An installed distribution, as far as the plan needs it."""

    name: str  # normalized
    version: str
    requires: tuple[str, ...]  # its Requires-Dist lines, markers included
    extras: tuple[str, ...] = ()  # its Provides-Extra


def closure(seeds: Iterable[tuple[str, str]], dists: Mapping[str, DistFacts]) -> set[str]:
    """The installed distributions `seeds` ((name, extra) pairs; extra "" for none) need,
    themselves included: each one's requirements whose markers hold for this interpreter
    and the extra it was asked with, followed through what is installed."""
    seen: set[tuple[str, str]] = set()
    stack = [(normalize(name), extra) for name, extra in seeds]
    while stack:
        name, extra = stack.pop()
        if (name, extra) in seen or name not in dists:
            continue
        seen.add((name, extra))
        for requirement in _requirements(dists[name], extra):
            target = normalize(requirement.name)
            stack.append((target, ""))
            stack.extend((target, normalize(x)) for x in requirement.extras)
    return {name for name, _ in seen}


def included_distributions(dists: Mapping[str, DistFacts]) -> list[str]:
    """The names (sorted) of the installed distributions the runtime base holds.

    Raises:
        LookupError: muster's own distribution is not among them (its requirements are
            what is left out, so without them nothing can be said).
    """
    own = dists.get(OWN_DISTRIBUTION)
    if own is None:
        raise LookupError(f"the {OWN_DISTRIBUTION!r} distribution is not installed where the "
                          "server runs, so its requirements cannot be told apart from "
                          "training packages (pip install muster, or -e . in a checkout)")
    server_extras = [x for x in own.extras if normalize(x) not in SERVER_EXTRAS_EXCEPT]
    server = closure([(OWN_DISTRIBUTION, ""), *((OWN_DISTRIBUTION, x) for x in server_extras)],
                     dists)
    training_seeds = [(name, "") for name in TRAINING_PACKAGES]
    for extra in own.extras:
        if normalize(extra) in SERVER_EXTRAS_EXCEPT:
            training_seeds += [(normalize(r.name), "") for r in _extra_only(own, extra)]
    training = closure(training_seeds, dists)
    left_out = (server - training) | {OWN_DISTRIBUTION}
    return sorted(name for name in dists if name not in left_out)


def _requirements(dist: DistFacts, extra: str) -> Iterator[Requirement]:
    for line in dist.requires:
        requirement = _parse(line)
        if requirement is not None and _holds(requirement.marker, extra):
            yield requirement


def _extra_only(dist: DistFacts, extra: str) -> Iterator[Requirement]:
    """The requirements an extra adds to the distribution's own."""
    for line in dist.requires:
        requirement = _parse(line)
        if (requirement is not None and requirement.marker is not None
                and _holds(requirement.marker, extra) and not _holds(requirement.marker, "")):
            yield requirement


def _parse(line: str) -> Requirement | None:
    try:
        return Requirement(line)
    except InvalidRequirement:
        return None  # a malformed line in someone's metadata: pip ignores it too


def _holds(marker: Marker | None, extra: str) -> bool:
    return marker is None or marker.evaluate({"extra": extra})


def link_plan(owned: Iterable[tuple[Sequence[str], str]], included: set[str]
              ) -> list[tuple[str, ...]]:
    """The paths (relative to site-packages, as parts) the base links, each to the same
    path in the real site-packages; the directories on the way to a deeper one are made.

    Args:
        owned: each file a RECORD names, as (path parts, owning distribution); paths that
            leave site-packages (`../../../bin/x`) are the caller's to drop.
        included: the distributions the base holds.
    """
    return list(_links([(tuple(parts), owner) for parts, owner in owned if parts],
                       included, ()))


def _links(entries: list[tuple[tuple[str, ...], str]], included: set[str],
           prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    groups: dict[str, list[tuple[tuple[str, ...], str]]] = {}
    for parts, owner in entries:
        groups.setdefault(parts[0], []).append((parts[1:], owner))
    for name in sorted(groups):
        members = groups[name]
        owners = {owner for _, owner in members}
        if not owners & included:
            continue
        # Linked whole when only included distributions own it, or when it is a file
        # (some RECORD names it itself); else a directory of its included entries.
        if owners <= included or any(not rest for rest, _ in members):
            yield (*prefix, name)
        else:
            yield from _links([(rest, owner) for rest, owner in members if owner in included],
                              included, (*prefix, name))
