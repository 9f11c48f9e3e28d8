"""Determined AI experiment configs (determined 0.38's format), read as muster's.

`detect` says whether parsed YAML is a Determined config; `translate` turns one into
muster's config data, with exactly one line per key it was given: what the key became
(`Translation.mapped`), or why muster does without it (`Translation.ignored`). What muster
cannot run at all (a Trial class, horovod, a key written in the config) is a problem, named
with its fix, never a line. Pure: data in, data and lines out.

The rule (docs/how-to/coming-from-determined.md): a config is Determined's when it has a
top-level `muster:` mapping (muster's own settings, laid over the translation: the explicit
mark), or when it has at least one key only Determined's schema has (or a `determined.launch`
or Trial-class entrypoint) and no key or form only muster has. A muster config never holds a
key only Determined has (each is refused with a hint, `FOREIGN_KEYS`), so a valid one is
never read as Determined's; one with a stray Determined key and any key of muster's own
stays muster's and gets the hint.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel

from muster.config import space
from muster.config.problems import config_error
from muster.config.schema import (
    LENGTH_UNITS,
    MAX_TRIALS,
    CheckpointStorageConfig,
    EnvironmentConfig,
    ExperimentConfig,
    ReproducibilityConfig,
    ResourcesConfig,
    SearcherConfig,
)
from muster.config.secrets import source_of
from muster.launch.torchrun import python_module

__all__ = ["DETERMINED_KEYS", "MARK", "Detection", "SlotKind", "Translation", "detect",
           "translate"]

Data = dict[str, Any]  # a config as YAML gives it: free, checked by the schema afterwards

MARK = "muster"  # the top-level block of muster's own settings: never a key of muster's
# Every key of Determined 0.38's experiment config (schemas/expconf/v0), by section.
DETERMINED_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({
        "bind_mounts", "checkpoint_policy", "checkpoint_storage", "data", "data_layer",
        "debug", "description", "entrypoint", "environment", "hyperparameters",
        "integrations", "internal", "labels", "log_policies", "max_restarts",
        "min_checkpoint_period", "min_validation_period", "name", "optimizations", "pbs",
        "perform_initial_validation", "preemption_timeout", "profiling", "project",
        "records_per_epoch", "reproducibility", "resources", "retention_policy",
        "scheduling_unit", "searcher", "security", "slurm", "tensorboard_storage",
        "workspace"}),
    "environment": frozenset({
        "image", "environment_variables", "proxy_ports", "ports", "force_pull_image",
        "registry_auth", "add_capabilities", "drop_capabilities", "pod_spec"}),
    "resources": frozenset({
        "agent_label", "devices", "is_single_node", "max_slots", "native_parallel",
        "priority", "resource_pool", "shm_size", "slots", "slots_per_trial", "weight"}),
    "searcher": frozenset({
        "name", "metric", "smaller_is_better", "max_trials", "max_concurrent_trials",
        "max_length", "max_time", "time_metric", "max_rungs", "divisor", "mode",
        "bracket_rungs", "stop_once", "num_rungs", "source_trial_id",
        "source_checkpoint_uuid", "budget", "train_stragglers", "unit", "population_size",
        "num_rounds", "length_per_round", "replace_function", "explore_function"}),
    "checkpoint_storage": frozenset({
        "type", "save_experiment_best", "save_trial_best", "save_trial_latest", "host_path",
        "storage_path", "propagation", "container_path", "checkpoint_path",
        "tensorboard_path", "bucket", "prefix", "endpoint_url", "access_key", "secret_key",
        "container", "connection_string", "account_url", "credential", "user"}),
    "reproducibility": frozenset({"experiment_seed"}),
}
_MUSTER_SECTIONS: dict[str, type[BaseModel]] = {
    "": ExperimentConfig, "environment": EnvironmentConfig, "resources": ResourcesConfig,
    "searcher": SearcherConfig, "checkpoint_storage": CheckpointStorageConfig,
    "reproducibility": ReproducibilityConfig,
}
_OWN_SEARCHERS = frozenset({"single", "grid", "random", "adaptive_asha", "asha", "pbt"})
_RETIRED_SEARCHERS = frozenset({"custom", "adaptive", "adaptive_simple", "sync_halving"})
_TRIAL_CLASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # model_def:MNistTrial
_PYTHON = re.compile(r"python[0-9.]*")
# What makes `sh -c` read a line otherwise than shlex.split: operators, expansions, globs,
# comments, several lines, and a leading `NAME=value`.
_SHELL = re.compile(r"[|&;<>()$`*?\[~#\n]|^\s*[A-Za-z_]\w*=")
_TORCHRUN_LAUNCHERS = {
    "torch_distributed": "muster starts the replicas with torchrun's variables itself",
    "deepspeed": "muster starts the replicas with torchrun's variables, which "
                 "deepspeed.init_distributed() reads (no hostfile, no sshd)",
}
_PORT_A_TRIAL = ("muster runs scripts, not Trial classes: train in a script with Determined's "
                 "Core API (`with det.core.init() as core_context: ...`, run as `entrypoint: "
                 "python3 train.py`: muster gives it its own Core API as `determined`), or one "
                 "that calls muster.harness")
_NO_CONTAINERS = ("muster runs a trial as processes on the host, not in a container: the "
                  "packages it needs go in environment.pip or environment.requirements (under "
                  "`muster:`), or it runs on an interpreter that has them (environment.python)")
_TRIAL_API_ONLY = "only Determined's Trial API reads it; a script validates and checkpoints "
_GPU_HINT = ("Determined's slots are GPUs here: this server schedules GPUs (for processes "
             "without one, add `muster: {resources: {gpus_per_replica: 0}}`)")
_CPU_HINT = ("Determined's slots are processes here, like its CPU slots: this server schedules "
             "no GPUs")

# Keys muster does without, and why.
_IGNORED: dict[str, str] = {
    "checkpoint_policy": _TRIAL_API_ONLY + "when it decides; muster keeps what it saves by "
                                           "checkpoint_storage.save_*",
    "data": "muster's `data` names a directory it scans before the launch; Determined's "
            "free-form data for the script is not passed on: put the values in "
            "hyperparameters or in the script",
    "data_layer": "removed in Determined 0.19.10, which ignores it too",
    "integrations": "muster has no Pachyderm or webhook integrations",
    "internal": "Determined's own bookkeeping",
    "log_policies": "muster classifies how each process ended itself (out of memory, a crash "
                    "in the script, a lost host...) and retries by kind (failure_policy), "
                    "without log patterns",
    "retention_policy": "muster keeps a trial's logs until its experiment is deleted",
    "min_checkpoint_period": _TRIAL_API_ONLY + "when it decides",
    "min_validation_period": _TRIAL_API_ONLY + "when it decides",
    "scheduling_unit": _TRIAL_API_ONLY + "when it decides",
    "perform_initial_validation": _TRIAL_API_ONLY + "when it decides",
    "optimizations": "only Determined's Trial API reads it; the script sets up its own "
                     "distributed training",
    "pbs": "muster does not submit to PBS: it runs trials on its own hosts",
    "slurm": "muster does not submit to Slurm: it runs trials on its own hosts",
    "profiling": "muster does not profile: run a profiler in the script (torch.profiler)",
    "records_per_epoch": "Determined turns lengths between records and epochs with it; muster "
                         "keeps a length in the unit it is written in. For muster to hold "
                         "each epoch to a count, set verify.expected_samples (under "
                         "`muster:`) and report ctx.samples",
    "security": "Kerberos is not supported: trials run as the server's user, or as their "
                "owner's account (run_as)",
    "tensorboard_storage": "muster keeps no TensorBoard files: the script writes its own",
    "environment.image": _NO_CONTAINERS,
    "environment.force_pull_image": _NO_CONTAINERS,
    "environment.registry_auth": _NO_CONTAINERS,
    "environment.add_capabilities": _NO_CONTAINERS,
    "environment.drop_capabilities": _NO_CONTAINERS,
    "environment.pod_spec": "Kubernetes pod specs are not supported: muster runs processes "
                            "on its hosts",
    "environment.proxy_ports": "muster opens no proxy ports: a replica listens where it likes "
                               "on its host",
    "environment.ports": "muster opens no proxy ports: a replica listens where it likes on "
                         "its host",
    "resources.agent_label": "removed in Determined 0.20.0, which ignores it too",
    "resources.devices": "no container: the host's devices are there as they are",
    "resources.is_single_node": "muster places a trial's replicas itself",
    "resources.native_parallel": "every replica is a process muster starts",
    "resources.resource_pool": "this server is the one pool (resources.gpu_type picks GPUs "
                               "of one type)",
    "resources.shm_size": "no container: /dev/shm is the host's",
    "resources.slots": "a trial's slots are slots_per_trial",
    "resources.weight": "muster orders its queue by resources.priority; fair share by "
                        "weight is not supported",
    "searcher.bracket_rungs": "muster's adaptive_asha places its rungs by divisor and "
                              "max_rungs",
    "searcher.stop_once": "muster's asha stops a trial at most once, at the rung it falls "
                          "behind",
    "searcher.budget": "a key of Determined's retired searchers",
    "searcher.train_stragglers": "a key of Determined's retired searchers",
    "searcher.unit": "a key of Determined's retired searchers",
}
# Keys whose value muster takes as it is, under the same name.
_SAME = frozenset({
    "name", "description", "searcher.metric", "searcher.smaller_is_better",
    "searcher.max_trials", "searcher.mode", "searcher.max_rungs", "resources.priority",
    "searcher.source_trial_id", "searcher.source_checkpoint_uuid",  # warm starts
    # Determined's PBT (retired in its 0.38), under the same names (`muster.search.pbt`).
    "searcher.population_size", "searcher.num_rounds", "searcher.length_per_round",
    "searcher.replace_function", "searcher.explore_function",
    "reproducibility.experiment_seed", "checkpoint_storage.save_experiment_best",
    "checkpoint_storage.save_trial_best", "checkpoint_storage.save_trial_latest",
})


@dataclass(frozen=True)
class Detection:
    """What says whether a config is Determined's: its keys (and forms) only Determined has,
    those only muster has, and whether it carries the `muster:` mark."""

    determined_only: tuple[str, ...]
    muster_only: tuple[str, ...]
    marked: bool

    @property
    def is_determined(self) -> bool:
        return self.marked or (bool(self.determined_only) and not self.muster_only)

    def reason(self) -> str:
        """Why the config is read as it is, in a sentence."""
        if self.marked:
            return f"it has a top-level `{MARK}:` block"
        if self.is_determined:
            return f"it has keys only Determined has ({', '.join(self.determined_only)})"
        if self.muster_only:
            return (f"it has keys only muster has ({', '.join(self.muster_only)}), so it is "
                    "muster's config")
        return ("it has no key only Determined has (such as resources.slots_per_trial, "
                "max_restarts or environment.environment_variables), so it is muster's "
                "config as it is")


@dataclass(frozen=True)
class Translation:
    """A Determined config as muster's config data, with one line per key it was given."""

    config: Data
    mapped: tuple[str, ...]  # `key: value → what muster sets (why)`
    ignored: tuple[str, ...]  # `key: ignored: why`

    @property
    def lines(self) -> tuple[str, ...]:
        return self.mapped + self.ignored


def detect(data: Mapping[str, Any]) -> Detection:
    """Whether `data` (a config's top-level mapping) is a Determined config, and why."""
    determined: list[str] = []
    muster: list[str] = []
    for section, keys in DETERMINED_KEYS.items():
        block = data if not section else data.get(section)
        if not isinstance(block, Mapping):
            continue
        ours = set(_MUSTER_SECTIONS[section].model_fields)
        for key in block:
            path = f"{section}.{key}" if section else str(key)
            if key in keys and key not in ours:
                determined.append(path)
            elif key in ours and key not in keys:
                muster.append(path)
    forms = dict(_forms(data))
    determined += [path for path, whose in forms.items() if whose == "determined"]
    muster += [path for path, whose in forms.items() if whose == "muster"]
    return Detection(tuple(determined), tuple(muster), marked=MARK in data)


def _forms(data: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Keys both configs have, written in a form only one of them takes: (path, whose).

    Only muster's forms count, and Determined's entrypoints (a launcher, a Trial class),
    which nobody writes by mistake: a muster config with Determined's `debug: true` or
    `type: gcs` is a slip that its hint answers, not a Determined config."""
    if _launches_determined(data.get("entrypoint")):
        yield "entrypoint", "determined"
    if "debug" in data and isinstance(data["debug"], Mapping):
        yield "debug", "muster"
    if "integrations" in data and isinstance(data["integrations"], str):
        yield "integrations", "muster"
    if _section(data, "searcher").get("name") == "tpe":
        yield "searcher.name", "muster"


def _launches_determined(entrypoint: object) -> bool:
    """A Trial class, or a command that runs one of Determined's modules."""
    if isinstance(entrypoint, str):
        if _TRIAL_CLASS.fullmatch(entrypoint.strip()):
            return True
        try:
            entrypoint = shlex.split(entrypoint)
        except ValueError:
            return False
    if not isinstance(entrypoint, list) or not all(isinstance(w, str) for w in entrypoint):
        return False
    module = _module_of(entrypoint)
    return module is not None and module.startswith("determined.")


def _module_of(argv: list[str]) -> str | None:
    if not argv or not _PYTHON.fullmatch(PurePath(argv[0]).name):
        return None
    return python_module(argv[1:])


# --- translation --------------------------------------------------------------------------


# What a Determined slot is where the config runs (`translate`'s `slots`).
SlotKind = Literal["gpu", "cpu"]


@dataclass
class _Translating:
    """A translation under way: what it has set, said and found wrong so far."""

    source: Mapping[str, Any]
    config: Data = field(default_factory=dict)
    mapped: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    launcher: str | None = None  # a determined.launch module muster stands in for
    replicas: int = 1
    gpus: int = 0  # per replica
    slots: SlotKind = "gpu"  # what a slot is on the server the config is submitted to

    def put(self, path: str, value: Any) -> None:
        """Set muster's key `path` ("resources.replicas") in the config."""
        *parents, leaf = path.split(".")
        node = self.config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def map(self, path: str, value: Any, became: str) -> None:
        self.mapped.append(f"{path}: {_shown(value)} → {became}")

    def same(self, path: str, value: Any) -> None:
        self.put(path, value)
        self.mapped.append(f"{path}: {_shown(value)} → the same")

    def ignore(self, path: str, reason: str) -> None:
        self.ignored.append(f"{path}: ignored: {reason}")

    def refuse(self, path: str, problem: str) -> None:
        self.problems.append(f"{path}: {problem}")


Handler = Callable[[_Translating, str, Any], None]


def translate(data: Mapping[str, Any], source: str = "<config>",
              slots: SlotKind = "gpu") -> Translation:
    """Muster's config data for the Determined config `data`, with a line per key.

    Args:
        slots: what Determined's slots are where it will run: "gpu" (a server that
            schedules GPUs: a GPU each, as on Determined's GPU agents) or "cpu" (a server
            without GPUs: a process each, as Determined's CPU slots).

    Raises:
        ConfigError: what muster cannot run, or a value it cannot read: one
            `key path: what to do` line each, under `source`.
    """
    t = _Translating(data, slots=slots)
    _plan_processes(t)
    for key, value in data.items():
        _translate_key(t, "", str(key), value)
    if "slots_per_trial" not in _section(data, "resources") and slots == "gpu":
        t.mapped.append("resources.slots_per_trial: not set (Determined's default: 1 slot) → "
                        "no GPUs; for one, add `muster: {resources: {gpus_per_replica: 1}}`")
    t.put("compat", "determined")
    if isinstance(data.get(MARK), Mapping):
        _merge(t.config, data[MARK])
    if t.problems:
        raise config_error(source, t.problems, "Determined experiment config")
    # muster's order of keys; a stray one (a typo under `muster:`) last, for the schema
    ordered = {key: t.config[key] for key in ExperimentConfig.model_fields if key in t.config}
    return Translation({**ordered, **t.config}, tuple(t.mapped), tuple(t.ignored))


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    block = data.get(name)
    return block if isinstance(block, Mapping) else {}


def _translate_key(t: _Translating, section: str, key: str, value: Any) -> None:
    """One key of section `section` (`""`: the top level): its line, or its problem."""
    path = f"{section}.{key}" if section else key
    handler = _HANDLERS.get(path)
    if value is None and path != MARK:
        t.mapped.append(f"{path}: null → muster's default")
    elif handler is not None:
        handler(t, path, value)
    elif path in _SAME:
        t.same(path, value)
    elif path in _IGNORED:
        t.ignore(path, _IGNORED[path])
    else:
        t.refuse(path, _unknown(section, key))


def _unknown(section: str, key: str) -> str:
    if key in _MUSTER_SECTIONS[section].model_fields:
        return (f"is muster's key, not Determined's: in a Determined config, muster's own "
                f"settings go under `{MARK}:` (e.g. `{MARK}: {{{section or key}: ...}}`)")
    close = difflib.get_close_matches(key, sorted(DETERMINED_KEYS[section]), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"not a key of Determined's experiment config{hint}"


def _sectioned(section: str) -> Handler:
    """The handler of a section's mapping: each of its keys in turn."""
    def handle(t: _Translating, path: str, value: Any) -> None:
        if not isinstance(value, Mapping):
            t.refuse(path, f"must be a mapping, got {_shown(value)}")
            return
        for key, item in value.items():
            _translate_key(t, section, str(key), item)
    return handle


# --- processes: entrypoint and slots ------------------------------------------------------


def _plan_processes(t: _Translating) -> None:
    """The replicas and GPUs of each trial, from the entrypoint's launcher and the slots."""
    t.launcher = _launcher_of(t.source.get("entrypoint"))
    slots = _section(t.source, "resources").get("slots_per_trial")
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 0:
        return  # not set, or refused where its line is written
    if t.launcher is not None:
        t.replicas, t.gpus = max(slots, 1), min(slots, 1)
    else:
        t.replicas, t.gpus = 1, slots
    if t.slots == "cpu":
        t.gpus = 0


def _launcher_of(entrypoint: object) -> str | None:
    try:
        _argv, launcher, _how = _command(entrypoint)
    except ValueError:
        return None
    return launcher


def _command(entrypoint: object) -> tuple[list[str], str | None, str]:
    """The command muster runs for a Determined entrypoint, the determined.launch module it
    stands in for (or None), and what changed, for the line.

    Raises:
        ValueError: what muster cannot run (a Trial class, horovod...), and what to do.
    """
    if isinstance(entrypoint, str):
        if _TRIAL_CLASS.fullmatch(entrypoint.strip()):
            raise ValueError(f"{entrypoint.strip()!r} is a Determined Trial class; "
                             + _PORT_A_TRIAL)
        if _SHELL.search(entrypoint):
            if "determined." in entrypoint:
                raise ValueError("a determined.launch line inside shell syntax: write it as "
                                 "one command, `python3 -m determined.launch.torch_distributed "
                                 "python3 train.py ...`")
            return ["sh", "-c", entrypoint], None, ("Determined runs a string with sh -c; "
                                                    "muster runs no shell unless asked")
        try:
            entrypoint = shlex.split(entrypoint)
        except ValueError as exc:
            raise ValueError(f"cannot be split into arguments: {exc}") from None
    if not isinstance(entrypoint, list) or not entrypoint or not all(
            isinstance(word, str) for word in entrypoint):
        raise ValueError(f"must be a command line or a list of its words, got "
                         f"{_shown(entrypoint)}")
    module = _module_of(entrypoint)
    if module is None or not module.startswith("determined."):
        return entrypoint, None, ""
    return _launched(entrypoint, module)


def _launched(argv: list[str], module: str) -> tuple[list[str], str | None, str]:
    """The script a `python -m determined.launch.NAME ...` line starts."""
    launcher = module.removeprefix("determined.launch.")
    if module == "determined.exec.harness":
        raise ValueError("runs a Trial class; " + _PORT_A_TRIAL)
    if launcher not in _TORCHRUN_LAUNCHERS:
        raise ValueError(f"runs {module}, which muster does not stand in for: it starts a "
                         "script's replicas with torchrun's variables (`python3 -m "
                         "determined.launch.torch_distributed python3 train.py`, or "
                         "deepspeed's); port the script to torch.distributed")
    args = argv[_after_module(argv, module):]
    if launcher == "torch_distributed" and "--" in args:
        split = args.index("--")
        if split:
            raise ValueError(f"torch.distributed.run's options {shlex.join(args[:split])} say "
                             "how many processes start and where, which muster decides (from "
                             "resources.slots_per_trial): remove them")
        args = args[1:]
    if args and (args[0] == "--trial" or args[0].startswith("--trial=")):
        raise ValueError(f"{module} --trial runs a Trial class; " + _PORT_A_TRIAL)
    if not args or args[0].startswith("-"):
        raise ValueError(f"names no script for {module} to run (`python3 -m {module} python3 "
                         "train.py`)")
    return args, launcher, _TORCHRUN_LAUNCHERS[launcher]


def _after_module(argv: list[str], module: str) -> int:
    """The index of the first argument after `-m MODULE` in `argv`."""
    for at, word in enumerate(argv[1:], start=1):
        if word == module or (word.startswith("-") and word.endswith("m" + module)):
            return at + 1
    return len(argv)


def _entrypoint(t: _Translating, path: str, value: Any) -> None:
    try:
        argv, launcher, how = _command(value)
    except ValueError as exc:
        t.refuse(path, str(exc))
        return
    command = shlex.join(argv)  # muster splits it back into these words
    t.put("entrypoint", command)
    became = f"entrypoint: {_short(command)}"
    if command == value:
        became = "the same"
    elif launcher is not None:
        t.put("resources.distributed_env", "always")
        became += (f", resources.distributed_env: always ({t.replicas} "
                   f"{'replica' if t.replicas == 1 else 'replicas'}: {how})")
    elif how:
        became += f" ({how})"
    t.map(path, value, became)


def _slots_per_trial(t: _Translating, path: str, value: Any) -> None:
    if not _whole(t, path, value, least=0):
        return
    t.put("resources.replicas", t.replicas)
    t.put("resources.gpus_per_replica", t.gpus)
    if value == 0:
        why = "a trial without slots"
    elif t.launcher is not None:
        why = (f"determined.launch.{t.launcher} starts a process per slot; "
               f"{_GPU_HINT if t.slots == 'gpu' else _CPU_HINT}")
    else:
        why = (f"without a launcher Determined starts one process that sees every slot; "
               f"{_GPU_HINT if t.slots == 'gpu' else _CPU_HINT}")
    t.map(path, value, f"resources.replicas: {t.replicas}, gpus_per_replica: {t.gpus} ({why})")


def _max_slots(t: _Translating, path: str, value: Any) -> None:
    """Determined counts an experiment's slots at once; muster its replicas at once."""
    if not _whole(t, path, value, least=1):
        return
    per_replica = max(t.gpus, 1)
    replicas = value // per_replica
    if replicas < t.replicas:
        t.refuse(path, f"is {value}, fewer than one trial's {t.replicas * per_replica} slots: "
                       "no trial could ever start; raise it")
        return
    t.put("resources.max_slots", replicas)
    why = (f" (muster counts replicas at once, each {per_replica} of Determined's slots)"
           if per_replica > 1 else " (replicas at once: a slot each)")
    t.map(path, value, f"resources.max_slots: {replicas}{why}")


# --- environment --------------------------------------------------------------------------


def _environment_variables(t: _Translating, path: str, value: Any) -> None:
    """A list of `NAME=value`, or one list per kind of device (the trial's is taken)."""
    unused: list[str] = []
    entries: object = value
    if isinstance(value, Mapping):
        kinds = ("cuda", "gpu") if t.gpus else ("cpu",)
        unused = [str(kind) for kind in value if kind not in kinds and value[kind]]
        lists = [value.get(kind) or [] for kind in kinds]
        entries = [e for one in lists for e in one] if all(isinstance(one, list)
                                                          for one in lists) else None
    if not isinstance(entries, list):
        t.refuse(path, f"must be a list of NAME=value, or a mapping of cpu, cuda, rocm "
                       f"to such lists; got {_shown(value)}")
        return
    variables: dict[str, str] = {}
    for i, entry in enumerate(entries):
        name, sep, text = entry.partition("=") if isinstance(entry, str) else ("", "", "")
        if not sep or not name:
            t.refuse(f"{path}[{i}]", f"must be NAME=value, got {_shown(entry)}")
            continue
        variables[name] = text
    t.put("environment.variables", variables)
    kind, has = ("cuda", "GPUs") if t.gpus else ("cpu", "no GPU")
    why = f" (the {kind} list: the trial has {has}; {', '.join(unused)} not used)"
    t.map(path, value, f"environment.variables: {_shown(variables)}{why if unused else ''}")


# --- searcher -----------------------------------------------------------------------------


def _searcher_name(t: _Translating, path: str, value: Any) -> None:
    if not isinstance(value, str):
        t.refuse(path, f"must be a searcher's name, got {_shown(value)}")
    elif value in _RETIRED_SEARCHERS:
        t.refuse(path, f"{value!r} is one of Determined's retired searchers; use single, grid, "
                       "random, async_halving, adaptive_asha or pbt")
    elif value == "async_halving":
        t.put(path, "asha")
        t.map(path, value, "searcher.name: asha")
    elif value == "single" and _searched(t.source.get("hyperparameters")):
        if _section(t.source, "searcher").get("metric") is None:
            t.refuse(path, "single over ranges is muster's random search of one trial, which "
                           "needs the metric it reports: set searcher.metric")
            return
        t.put(path, "random")
        t.put("searcher.max_trials", 1)
        t.map(path, value, "searcher.name: random, max_trials: 1 (Determined's single draws "
                           "one point of the ranges in hyperparameters; muster's single takes "
                           "constants only)")
    elif value in _OWN_SEARCHERS:
        t.same(path, value)
    else:
        t.refuse(path, f"must be one of single, grid, random, async_halving, adaptive_asha, "
                       f"pbt; "
                       f"got {_shown(value)}")


def _searched(hyperparameters: object) -> bool:
    """Whether the space has a range (int, double, log, categorical) for a searcher."""
    if not isinstance(hyperparameters, Mapping):
        return False
    try:
        return bool(space.parse(hyperparameters).searched())
    except space.SpaceProblems:
        return False  # named when the translated config is validated


def _max_concurrent_trials(t: _Translating, path: str, value: Any) -> None:
    if value == 0 and not isinstance(value, bool):
        t.put(path, MAX_TRIALS)
        t.map(path, value, f"searcher.max_concurrent_trials: {MAX_TRIALS} (Determined's 0 is "
                           "no limit; muster's is a number)")
    else:
        t.same(path, value)


def _divisor(t: _Translating, path: str, value: Any) -> None:
    if isinstance(value, float) and value.is_integer():
        t.put(path, int(value))
        t.map(path, value, f"searcher.divisor: {int(value)}")
    elif isinstance(value, float):
        t.refuse(path, f"muster's divisor is a whole number (>= 2), got {value}")
    else:
        t.same(path, value)


def _max_length(t: _Translating, path: str, value: Any) -> None:
    if isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in LENGTH_UNITS:
        [(unit, length)] = value.items()
        t.put("searcher.max_length", length)
        t.put("searcher.max_length_unit", unit)
        t.map(path, value, f"searcher.max_length: {_shown(length)}, max_length_unit: {unit} "
                           "(in the steps the script reports validation at)")
    else:
        t.same(path, value)  # a number of steps, or a form the schema names the problem of


def _max_time(t: _Translating, path: str, value: Any) -> None:
    if "max_length" in _section(t.source, "searcher"):
        t.refuse(path, "and searcher.max_length both say how long a trial trains: keep one")
        return
    if "time_metric" not in _section(t.source, "searcher"):
        t.refuse(path, "goes with searcher.time_metric, the metric that counts a trial's "
                       "progress: give both")
        return
    t.put("searcher.max_length", value)
    t.map(path, value, f"searcher.max_length: {_shown(value)} (counted in time_metric's "
                       "values, as Determined counts max_time)")


def _time_metric(t: _Translating, path: str, value: Any) -> None:
    if "max_time" not in _section(t.source, "searcher"):
        t.refuse(path, "goes with searcher.max_time, how long a trial trains: give both")
        return
    t.same(path, value)


def _num_rungs(t: _Translating, path: str, value: Any) -> None:
    t.put("searcher.max_rungs", value)
    t.map(path, value, f"searcher.max_rungs: {_shown(value)}")


# --- checkpoint storage -------------------------------------------------------------------


def _checkpoint_storage(t: _Translating, path: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        t.refuse(path, f"must be a mapping, got {_shown(value)}")
        return
    kind = value.get("type")
    for key, item in value.items():
        where = f"{path}.{key}"
        if item is None or where in _SAME or key not in DETERMINED_KEYS["checkpoint_storage"]:
            _translate_key(t, "checkpoint_storage", str(key), item)
        elif key == "type":
            _storage_type(t, where, item)
        elif kind == "shared_fs":
            _shared_fs_key(t, where, value)
        elif kind == "s3":
            _s3_key(t, where, item)
        else:
            t.ignore(where, f"goes with type {_shown(kind)}, which muster does not store to")


def _storage_type(t: _Translating, path: str, value: Any) -> None:
    if value in ("shared_fs", "s3"):
        t.same(path, value)
    else:
        t.ignore(path, f"muster stores checkpoints on shared_fs or s3, not {_shown(value)}: the "
                       "server's default storage keeps them (Google Cloud Storage answers S3 "
                       "too: type: s3, endpoint_url: https://storage.googleapis.com)")


def _shared_fs_key(t: _Translating, path: str, block: Mapping[str, Any]) -> None:
    key = path.rpartition(".")[2]
    if key not in ("host_path", "storage_path"):
        t.ignore(path, "muster mounts nothing: checkpoints go under checkpoint_storage.path")
        return
    joined = _shared_fs_path(block.get("host_path"), block.get("storage_path"))
    if joined is None:
        t.refuse(path, "host_path must be an absolute directory, and storage_path a "
                       "directory under it (or relative to it)")
        return
    t.put("checkpoint_storage.path", joined)
    became = (f"checkpoint_storage.path: {joined}" if key == "host_path"
              else "joined to host_path in checkpoint_storage.path")
    t.map(path, block[key], became)


def _shared_fs_path(host: object, storage: object) -> str | None:
    """host_path and storage_path as the one directory muster writes to."""
    if not isinstance(host, str) or not host.startswith("/"):
        return None
    if storage is None:
        return host
    if not isinstance(storage, str):
        return None
    joined = PurePosixPath(host, storage)
    if ".." in joined.parts or not joined.is_relative_to(host):
        return None
    return str(joined)


def _s3_key(t: _Translating, path: str, value: Any) -> None:
    key = path.rpartition(".")[2]
    keys = key in ("access_key", "secret_key")
    if key in ("bucket", "prefix", "endpoint_url") or (keys and _names_a_source(value)):
        t.same(path, value)
    elif keys:
        t.refuse(path, "a key written in the config would be stored and shown with it (muster "
                       "keeps the config as it was submitted): remove it, and let the server "
                       "use boto3's default credentials (its environment, ~/.aws, an instance "
                       "role), or write where it reads the key: env:NAME or file:/path")
    else:
        t.ignore(path, "not an s3 setting")


def _names_a_source(value: object) -> bool:
    try:
        source = source_of(value) if isinstance(value, str) else None
    except ValueError:
        return False
    return source is not None and source.kind != "submit"


# --- the rest -----------------------------------------------------------------------------


def _hyperparameters(t: _Translating, path: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        t.refuse(path, f"must be a mapping, got {_shown(value)}")
        return
    converted: list[str] = []
    written = _yaml12_numbers(value, "", converted)
    for where, problem in _non_scalar_choices(written, ""):
        t.refuse(f"{path}.{where}", problem)
    t.put(path, written)
    names = ", ".join(str(name) for name in value)
    read = (f"; read as numbers, as Determined's YAML 1.2 reads them: {', '.join(converted)}"
            if converted else "")
    t.mapped.append(f"{path}: {_short(names)} → the same (muster reads Determined's types: "
                    f"const, int, double, log, categorical, nesting{read})")


_YAML12_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+")


def _yaml12_numbers(tree: Mapping[str, Any], prefix: str, converted: list[str]) -> Data:
    """`tree` with each string YAML 1.2 reads as a number (`1e-5`, which YAML 1.1 reads as a
    string) made that number; the paths changed are added to `converted`."""
    return {key: _yaml12_number(value, f"{prefix}{key}", converted)
            for key, value in tree.items()}


def _yaml12_number(value: Any, path: str, converted: list[str]) -> Any:
    if isinstance(value, Mapping):
        return _yaml12_numbers(value, f"{path}.", converted)
    if isinstance(value, list):
        return [_yaml12_number(item, f"{path}[{i}]", converted)
                for i, item in enumerate(value)]
    if isinstance(value, str) and _YAML12_FLOAT.fullmatch(value.strip()):
        converted.append(f"{path}: {value}")
        return float(value)
    return value


def _non_scalar_choices(tree: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, str]]:
    """Categorical values muster cannot offer: lists and mappings (Determined's may be)."""
    for key, value in tree.items():
        if not isinstance(value, Mapping):
            continue
        if "type" not in value:
            yield from _non_scalar_choices(value, f"{prefix}{key}.")
        elif value.get("type") == "categorical" and isinstance(value.get("vals"), list):
            for i, choice in enumerate(value["vals"]):
                if isinstance(choice, list | Mapping):
                    yield (f"{prefix}{key}.vals[{i}]", "muster's categorical values are "
                           "numbers, strings, true/false or null: list names instead (e.g. "
                           "vals: [small, large]) and look each one up in the script")


def _labels(t: _Translating, path: str, value: Any) -> None:
    if not isinstance(value, list):
        t.refuse(path, f"must be a list of strings, got {_shown(value)}")
        return
    t.config.setdefault("labels", [])[:0] = value  # before the workspace's and project's
    t.mapped.append(f"{path}: {_shown(value)} → the same")


def _as_label(t: _Translating, path: str, value: Any) -> None:
    """A workspace or project: a label, since muster has neither."""
    if value == "":
        t.mapped.append(f"{path}: '' → nothing (Determined's default)")
        return
    label = f"{path}:{value}"
    t.config.setdefault("labels", []).append(label)
    t.map(path, value, f"labels: + {label} (muster has no {path}s)")


def _max_restarts(t: _Translating, path: str, value: Any) -> None:
    if not _whole(t, path, value, least=0):
        return
    t.put("failure_policy.trial_retries", value)
    t.put("failure_policy.replica_restarts", 0)
    t.map(path, value, f"failure_policy.trial_retries: {_shown(value)}, replica_restarts: 0 "
                       "(every restart counts against the one budget, as in Determined; a "
                       "crash in the script's own code fails at once unless "
                       "failure_policy.retry_user_errors says otherwise)")


def _preemption_timeout(t: _Translating, path: str, value: Any) -> None:
    if not _whole(t, path, value, least=0):
        return
    t.put("failure_policy.stop_grace", f"{value}s")
    t.map(path, value, f"failure_policy.stop_grace: {value}s (how long a stopped trial has "
                       "between SIGTERM and SIGKILL, preempted, paused or killed)")


def _debug(t: _Translating, path: str, value: Any) -> None:
    if value is True:
        t.ignore(path, "muster keeps every line a trial writes; Determined's debug logging has "
                       "no counterpart (muster's `debug` is {torch_distributed: detail})")
    elif value is False:
        t.mapped.append(f"{path}: false → nothing (the default)")
    else:
        t.refuse(path, f"must be true or false, got {_shown(value)}")


def _bind_mounts(t: _Translating, path: str, value: Any) -> None:
    mounts = [m for m in value if isinstance(m, Mapping)] if isinstance(value, list) else []
    moved = [f"{m.get('host_path')} (not {m.get('container_path')})" for m in mounts
             if m.get("host_path") != m.get("container_path")]
    where = (f": the script must read {', '.join(moved)}" if moved
             else ": the script reads them at the same paths")
    t.ignore(path, f"muster runs trials on the host, where paths need no mount{where}")


def _overrides(t: _Translating, path: str, value: Any) -> None:
    if value is None:
        t.mapped.append(f"{path}: (empty) → nothing set over the translation (the block marks "
                        "the config as Determined's)")
    elif not isinstance(value, Mapping):
        t.refuse(path, f"must be a mapping of muster's own settings, got {_shown(value)}")
    else:
        keys = ", ".join(_leaves(value, "")) or "nothing"
        t.mapped.append(f"{path}: {_short(keys)} → set over the translation (muster's own "
                        "keys)")


def _leaves(tree: Mapping[str, Any], prefix: str) -> Iterator[str]:
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _merge(base: Data, over: Mapping[str, Any]) -> None:
    """Lay `over` on `base`: mappings key by key, anything else replaced."""
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value


_HANDLERS: dict[str, Handler] = {
    "entrypoint": _entrypoint,
    "hyperparameters": _hyperparameters,
    "labels": _labels,
    "workspace": _as_label,
    "project": _as_label,
    "max_restarts": _max_restarts,
    "preemption_timeout": _preemption_timeout,
    "debug": _debug,
    "bind_mounts": _bind_mounts,
    "checkpoint_storage": _checkpoint_storage,
    MARK: _overrides,
    "environment": _sectioned("environment"),
    "environment.environment_variables": _environment_variables,
    "resources": _sectioned("resources"),
    "resources.slots_per_trial": _slots_per_trial,
    "resources.max_slots": _max_slots,
    "searcher": _sectioned("searcher"),
    "searcher.name": _searcher_name,
    "searcher.max_concurrent_trials": _max_concurrent_trials,
    "searcher.divisor": _divisor,
    "searcher.max_length": _max_length,
    "searcher.max_time": _max_time,
    "searcher.time_metric": _time_metric,
    "searcher.num_rungs": _num_rungs,
    "reproducibility": _sectioned("reproducibility"),
}


def _whole(t: _Translating, path: str, value: Any, least: int) -> bool:
    """Whether `value` is a whole number >= `least`; refused with its path where not."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= least:
        return True
    t.refuse(path, f"must be a whole number >= {least}, got {_shown(value)}")
    return False


def _shown(value: Any) -> str:
    """A value as YAML's flow style writes it, cut to one short line."""
    return _short(_flow(value))


def _flow(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, str) and (not value or value != value.strip()):
        return repr(value)
    return str(value)


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
