"""What differs between two runs' snapshots, most result-relevant first (issue 17).

Both snapshot parts (see `muster.diagnostics`) are flattened to dotted paths
(`frameworks.cuda`, `libraries.libcublas`, `hparams.lr`) and compared path by path. A null
and a missing field mean the same (the process could not know it), so a path present on one
side only is a difference with None on the other. Lists are compared as whole values,
except two rank fields: `gpus` is compared as the sorted GPU names (order and serial
numbers say nothing about the numbers a run produces), and `blas` as the sorted
"api library version" strings, with the thread counts as their own field, `blas.threads`.

The *outside* part (`muster.diagnostics`: what muster saw of the process from outside, at
the attempt's launch; every trial has one, with the harness or without) is compared as
`outside.python.*` and `outside.packages.*`, its lines marked "(seen from outside)". The
harness's rank parts win: between two trials that both have them, the interpreter is
compared per rank and not again from outside, and an outside difference that another part
already said (the same name, the same two values) is not said twice.

Pure: no I/O; whoever shows a diff reads the snapshots and hands them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from muster import api
from muster.states import DiffGroup

__all__ = [
    "GROUPS",
    "LEFT_OUT",
    "NAME_MAPS",
    "OUTSIDE",
    "PRIORITY",
    "VOLATILE",
    "VOLATILE_FIELDS",
    "Difference",
    "TrialSnapshots",
    "diff_ranks",
    "diff_trials",
    "result_relevant",
]


GROUPS: tuple[DiffGroup, ...] = tuple(DiffGroup)
# A part flattened: dotted path → leaf value, whatever JSON the part held there (the paths
# are the snapshot's, and a package or a variable is a path of its own).
Fields = dict[str, Any]

# A field is volatile, and never reported, when one of its path's segments is one of these
# names (a NAME_MAPS key excepted): it changes from run to run without changing what the
# run computes.
VOLATILE: frozenset[str] = frozenset({
    "hostname",  # ranks of one trial run on several machines; a rerun lands elsewhere
    "uuid",  # a GPU's serial number, not its model (`gpus` keeps only the names anyway)
    "executable", "path", "paths",  # where things happen to be installed or stored
    "time", "timestamp", "started_at", "ended_at", "completed_at", "recorded_at",
    "created_at",
})
# Whole fields that are volatile although their names are not.
VOLATILE_FIELDS: frozenset[str] = frozenset({
    # The GPUs the scheduler gave the rank (muster.launch sets it per rank); which GPUs a
    # rank has is in `gpus`, by model.
    "variables.CUDA_VISIBLE_DEVICES",
})

# Maps whose keys each name one thing (a package, a library family, a framework, a
# numerics switch, a variable, a hyperparameter): the key is never taken for a volatile
# segment (PyPI has a package called `path`), and a line shows the key without the map.
NAME_MAPS: tuple[str, ...] = (
    "environment.packages", "outside.packages", "packages", "libraries", "variables",
    "frameworks", "numerics", "hparams",
)

# Trial-part fields left out: hyperparameters are compared as `hparams.*` (the values the
# trial ran with, not the search space), and names and labels do not change results.
LEFT_OUT: tuple[str, ...] = (
    "config.hyperparameters", "config.name", "config.description", "config.labels",
)

# First match wins. A field no entry names is still shown, in a result-relevant group: an
# unknown difference is safer called relevant than filed away as platform noise.
_TRIAL_GROUPS: tuple[tuple[str, DiffGroup], ...] = (
    ("code", DiffGroup.CODE),
    ("environment", DiffGroup.PACKAGES),
    ("config", DiffGroup.CONFIG), ("hparams", DiffGroup.CONFIG), ("seed", DiffGroup.CONFIG),
    ("data", DiffGroup.CONFIG), ("source", DiffGroup.CONFIG),
)
_TRIAL_DEFAULT = DiffGroup.CONFIG
_RANK_GROUPS: tuple[tuple[str, DiffGroup], ...] = (
    # The interpreter's version changes numerics as much as torch's does.
    ("python.version", DiffGroup.FRAMEWORKS), ("python", DiffGroup.PLATFORM),
    ("platform.cpu", DiffGroup.HARDWARE), ("platform.machine", DiffGroup.HARDWARE),
    ("platform", DiffGroup.PLATFORM),
    ("frameworks", DiffGroup.FRAMEWORKS), ("driver", DiffGroup.FRAMEWORKS),
    ("libraries", DiffGroup.FRAMEWORKS),
    ("packages", DiffGroup.PACKAGES),
    ("numerics", DiffGroup.NUMERICS), ("variables", DiffGroup.NUMERICS),
    ("blas", DiffGroup.NUMERICS),
    ("seed", DiffGroup.NUMERICS),
    ("gpus", DiffGroup.HARDWARE),
)
_RANK_DEFAULT = DiffGroup.NUMERICS
# The interpreter's implementation changes numerics as much as its version does.
_OUTSIDE_GROUPS: tuple[tuple[str, DiffGroup], ...] = (
    ("outside.python", DiffGroup.FRAMEWORKS), ("outside.packages", DiffGroup.PACKAGES),
)
OUTSIDE = "outside"  # the prefix of every field of the outside part

# Within a group, these fields (fnmatch patterns) come first, in this order; the rest
# follow alphabetically.
PRIORITY: Mapping[DiffGroup, tuple[str, ...]] = {
    DiffGroup.CODE: ("code.git.commit", "code.git.dirty", "code.git.diff_sha256",
                 "code.tree_sha256", "code.files"),
    # A warm start's checkpoint is the weights the trial began with.
    DiffGroup.CONFIG: ("ranks", "source.checkpoint_uuid", "source.*", "hparams.*", "seed",
                       "data.fingerprint"),
    # Each package before the environment's key: the key is a hash of them all.
    DiffGroup.PACKAGES: ("environment.packages.torch", "packages.torch", "outside.packages.torch",
                     "environment.packages.*", "packages.*", "outside.packages.*"),
    DiffGroup.FRAMEWORKS: ("frameworks.cuda", "libraries.libcublas", "libraries.libcudnn",
                       "frameworks.cudnn", "frameworks.nccl", "libraries.libnccl",
                       "frameworks.torch", "driver", "python.version",
                       "outside.python.version", "outside.python.implementation"),
    DiffGroup.NUMERICS: ("variables.CUBLAS_WORKSPACE_CONFIG", "numerics.*",
                     "variables.PYTHONHASHSEED", "variables.NVIDIA_TF32_OVERRIDE",
                     "seed.torch_initial", "blas", "blas.threads"),
    DiffGroup.HARDWARE: ("gpus", "platform.cpu", "platform.machine"),
    DiffGroup.PLATFORM: ("platform.system", "platform.release"),
}


@dataclass(frozen=True)
class Difference:
    """One field whose value differs; `rank` is None for a trial-level field."""

    group: DiffGroup
    field: str
    a: Any
    b: Any
    rank: int | None

    def line(self) -> str:
        """`libcublas: libcublas.so.11.10.1.25 vs libcublas.so.11.10.3.66 (rank 0)`;
        `numpy: 1.26.4 vs 2.0.2 (seen from outside)`."""
        where = "" if self.rank is None else f" (rank {self.rank})"
        if _under(self.field, OUTSIDE):
            where = " (seen from outside)"
        return f"{_short_name(self.field)}: {_shown(self.a)} vs {_shown(self.b)}{where}"

    def view(self) -> api.SnapshotDifference:
        """The difference as `muster trial diff A B --json` lists it."""
        return {"group": self.group, "field": self.field, "a": self.a, "b": self.b,
                "rank": self.rank}


@dataclass(frozen=True)
class TrialSnapshots:
    """One trial's snapshot: its trial part, each rank's part (none without a harness), and
    the outside part of its latest attempt that has one (None: not recorded)."""

    trial: Mapping[str, Any]
    ranks: Mapping[int, Mapping[str, Any]]
    outside: Mapping[str, Any] | None = None


def diff_trials(a: TrialSnapshots, b: TrialSnapshots) -> list[Difference]:
    """Every non-volatile difference between two trials: the trial parts, then each rank of
    A against the same rank of B. Ranks present on one side only make one `ranks`
    difference and are not compared further."""
    found = _compare(_trial_fields(a.trial), _trial_fields(b.trial), _TRIAL_GROUPS,
                     _TRIAL_DEFAULT, None)
    if a.ranks.keys() != b.ranks.keys():
        found.append(Difference(DiffGroup.CONFIG, "ranks", sorted(a.ranks), sorted(b.ranks), None))
    for rank in sorted(a.ranks.keys() & b.ranks.keys()):
        found += _compare(_rank_fields(a.ranks[rank]), _rank_fields(b.ranks[rank]),
                          _RANK_GROUPS, _RANK_DEFAULT, rank)
    return _ordered(found + _outside_differences(a, b, found))


def _outside_differences(a: TrialSnapshots, b: TrialSnapshots,
                         said: list[Difference]) -> list[Difference]:
    """The outside parts compared, when both trials have one: less the interpreter where
    both have the harness's rank parts (they win), less what `said` already says."""
    if a.outside is None or b.outside is None:
        return []
    harness = bool(a.ranks) and bool(b.ranks)
    known = {(_short_name(d.field), _key(d.a), _key(d.b)) for d in said}
    return [d for d in _compare(_outside_fields(a.outside, harness),
                                _outside_fields(b.outside, harness), _OUTSIDE_GROUPS,
                                DiffGroup.PACKAGES, None)
            if (_short_name(d.field), _key(d.a), _key(d.b)) not in known]


def _outside_fields(part: Mapping[str, Any], harness: bool) -> Fields:
    kept = {"packages": part.get("packages")} | ({} if harness else {"python": part.get("python")})
    return _flatten(kept, OUTSIDE)


def _key(value: Any) -> Any:
    """A value as a set member (lists are compared whole)."""
    return tuple(value) if isinstance(value, list) else value


def diff_ranks(ranks: Mapping[int, Mapping[str, Any]]) -> list[Difference]:
    """Within one trial, each field where a rank differs from the lowest rank present
    (rank 0 normally): `a` is the lowest rank's value, `b` and `rank` the differing rank's."""
    if not ranks:
        return []
    first = min(ranks)
    base = _rank_fields(ranks[first])
    found: list[Difference] = []
    for rank in sorted(ranks):
        if rank != first:
            found += _compare(base, _rank_fields(ranks[rank]), _RANK_GROUPS, _RANK_DEFAULT,
                              rank)
    return _ordered(found)


def result_relevant(d: Difference) -> bool:
    """Whether the difference can plausibly change results: all but the platform group (the
    OS and kernel release are shown, last, but rarely change a number)."""
    return d.group != DiffGroup.PLATFORM


def _compare(a: Mapping[str, Any], b: Mapping[str, Any],
             groups: tuple[tuple[str, DiffGroup], ...], default: DiffGroup,
             rank: int | None) -> list[Difference]:
    return [Difference(_group_of(path, groups, default), path, a.get(path), b.get(path), rank)
            for path in sorted(a.keys() | b.keys())
            if not _volatile(path) and a.get(path) != b.get(path)]


def _trial_fields(part: Mapping[str, Any]) -> Fields:
    return {path: value for path, value in _flatten(part, "").items()
            if not any(_under(path, out) for out in LEFT_OUT)}


def _rank_fields(part: Mapping[str, Any]) -> Fields:
    rest = {key: value for key, value in part.items() if key not in ("gpus", "blas")}
    return _flatten(rest, "") | _gpu_fields(part.get("gpus")) | _blas_fields(part.get("blas"))


def _flatten(value: Any, prefix: str) -> Fields:
    """Dotted paths to leaves; null leaves and empty mappings are left out (null means
    unknown, the same as missing)."""
    if not isinstance(value, Mapping):
        return {} if value is None else {prefix: value}
    fields: Fields = {}
    for key, item in value.items():
        fields |= _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    return fields


def _gpu_fields(gpus: Any) -> Fields:
    if gpus is None:
        return {}
    return {"gpus": sorted(str(gpu.get("name")) for gpu in gpus)}


def _blas_fields(blas: Any) -> Fields:
    if blas is None:
        return {}
    return {"blas": sorted(_words(entry, "version") for entry in blas),
            "blas.threads": sorted(_words(entry, "threads") for entry in blas)}


def _words(entry: Mapping[str, Any], last: str) -> str:
    values = (entry.get("api"), entry.get("library"), entry.get(last))
    return " ".join(str(value) for value in values if value is not None)


def _volatile(path: str) -> bool:
    """Volatile as a whole field, or by one segment's name (a name map's key excepted)."""
    if path in VOLATILE_FIELDS:
        return True
    segments = path.split(".")
    name_map = next((m for m in NAME_MAPS if path.startswith(m + ".")), None)
    if name_map is not None:
        del segments[name_map.count(".") + 1]
    return not VOLATILE.isdisjoint(segments)


def _group_of(path: str, groups: tuple[tuple[str, DiffGroup], ...],
              default: DiffGroup) -> DiffGroup:
    return next((group for prefix, group in groups if _under(path, prefix)), default)


def _ordered(differences: list[Difference]) -> list[Difference]:
    return sorted(differences, key=lambda d: (
        GROUPS.index(d.group), _priority(d), d.field, -1 if d.rank is None else d.rank))


def _priority(d: Difference) -> int:
    patterns = PRIORITY[d.group]
    return next((i for i, pattern in enumerate(patterns) if fnmatchcase(d.field, pattern)),
                len(patterns))


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _short_name(field: str) -> str:
    """`libraries.libcublas` -> `libcublas`; a field outside the name maps keeps its path
    (`python.version`, `code.git.commit`), less the outside part's prefix (its line says
    where it was seen)."""
    for name_map in NAME_MAPS:
        if field.startswith(name_map + "."):
            return field[len(name_map) + 1:]
    return field.removeprefix(OUTSIDE + ".")


def _shown(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    return str(value)
