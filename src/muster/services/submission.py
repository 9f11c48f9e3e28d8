"""Checks made when an experiment is submitted, against what the server can see then.

The config's own validation (`muster.config`) knows the YAML alone. These checks also look
at the uploaded context, the server's files and its capacity, so that a mistake found
minutes later in a log — or never, by a trial that waits forever — is refused at once,
with the key path:

- the entrypoint's script is missing from the context (`python train.py`, no `train.py`);
- a shell operator is a word of the entrypoint (`&&`, `|`, `;`, `>`): it runs without a
  shell, so `python a.py && python b.py` would pass `&&` to a.py as an argument;
- `data.path` does not exist, is not a directory, or the server cannot read it; a relative
  one leads out of the context (`../..`, or a link); it holds no file the data manifest
  would count (unless `data.allow_empty`): looked for by a walk that stops at the first
  such file, bounded, so that the scan before the launch decides what the request cannot;
- one trial needs more than the whole cluster has (3 replicas on 2 slots; a GPU type it
  lacks), so it would wait in the queue forever.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from muster.config import ExperimentConfig
from muster.config.problems import config_error
from muster.containment import inside
from muster.errors import ConfigError
from muster.supervise.manifest import empty_data_problem, first_counted_file
from muster.words import count

__all__ = ["SHELL_OPERATORS", "ClusterCapacity", "check_submission"]

SHELL_OPERATORS = frozenset({"&&", "||", "|", "|&", ";", ";;", "&", ">", ">>", "<", "<<",
                             "<<<", "2>", "2>>", "2>&1", "&>", "1>", "1>>"})
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_SHELLS = frozenset({"bash", "sh", "zsh", "dash"})
_LAUNCHERS = frozenset({"torchrun"})  # their script is the first `.py` argument
# Python options that take the next word as their value (`python -W error train.py`).
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "--check-hash-based-pycs"})
_SHOWN_FILES = 5


@dataclass(frozen=True)
class ClusterCapacity:
    """What the cluster has in all: slots for replicas without GPUs, and GPUs by type.
    `can_grow`: it adds machines on demand, so a demand beyond today's total may still run."""

    slots: int
    gpus: dict[str, int]
    can_grow: bool = False


def check_submission(config: ExperimentConfig, context: Path, capacity: ClusterCapacity | None,
                     source: str) -> None:
    """Refuse what cannot run here, naming each problem's key path.

    Raises:
        ConfigError: one line per problem (HTTP 422).
    """
    problems = [*_entrypoint_problems(config.entrypoint, context),
                *_data_problems(config, context)]
    if capacity is not None and not capacity.can_grow:
        problems += _capacity_problems(config, capacity)
    if problems:
        raise config_error(source, problems)


def _entrypoint_problems(words: Sequence[str], context: Path) -> Iterator[str]:
    for i, word in enumerate(words):
        if word in SHELL_OPERATORS:
            yield (f"entrypoint[{i}]: {word!r} is a shell operator, but the entrypoint runs "
                   "without a shell, so it would reach the program as an argument; use a list "
                   "or a script (e.g. `entrypoint: [bash, run.sh]`)")
    found = _script(words)
    if found is None:
        return
    i, script = found
    if PurePosixPath(script).is_absolute() or script.startswith("~"):
        return  # on the server (or an image), not in the context: nothing to compare
    if not (context / script).is_file():
        yield (f"entrypoint[{i}]: {script!r} is not in the uploaded context directory"
               f"{_what_it_holds(context)}; upload the directory that holds it "
               "(`muster experiment create CONFIG DIR`), or fix the path")


def _script(words: Sequence[str]) -> tuple[int, str] | None:
    """(index, path) of the script the entrypoint runs, where it can be told."""
    program = os.path.basename(words[0])
    if _PYTHON.fullmatch(program):
        return _python_script(words)
    if program in _SHELLS:
        rest = list(enumerate(words))[1:]
        if any(word == "-c" for _, word in rest):
            return None
        return next(((i, w) for i, w in rest if not w.startswith("-")), None)
    if program in _LAUNCHERS:
        return next(((i, w) for i, w in enumerate(words) if i and w.endswith(".py")), None)
    if "/" in words[0] or words[0].endswith((".py", ".sh")):
        return 0, words[0]  # `./train.sh`, `scripts/run.py`
    return None  # a program on PATH


def _python_script(words: Sequence[str]) -> tuple[int, str] | None:
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-m", "-c", "-") or word.startswith(("-m", "-c")):
            return None  # a module, a command or stdin: no script file
        if word in _PYTHON_VALUE_OPTIONS:
            i += 2
            continue
        if not word.startswith("-"):
            return i, word
        i += 1
    return None  # the interactive interpreter


def _what_it_holds(context: Path) -> str:
    try:
        files = sorted(str(p.relative_to(context)) for p in context.rglob("*.py")
                       if p.is_file())[:_SHOWN_FILES + 1]
    except OSError:
        return ""
    if not files:
        return " (it holds no .py file)" if context.exists() else " (none was uploaded)"
    shown = ", ".join(files[:_SHOWN_FILES]) + (", ..." if len(files) > _SHOWN_FILES else "")
    return f" (its Python files: {shown})"


def _data_problems(config: ExperimentConfig, context: Path) -> Iterator[str]:
    if config.data is None:
        return
    written = config.data.path
    path = context / Path(written).expanduser()  # a relative path is inside the context
    if not written.startswith(("/", "~")) and not inside(str(path), [str(context)]):
        yield (f"data.path: {written!r} leads out of the uploaded context; name a directory "
               "inside it, or an absolute path")
        return
    where = f"{written!r}" + (f" (in the context: {path})" if not Path(written).is_absolute()
                              and not written.startswith("~") else "")
    if not path.exists():
        yield (f"data.path: {where} does not exist on the server, which scans it before the "
               "first launch; fix the path, or copy the data there")
    elif not path.is_dir():
        yield f"data.path: {where} is not a directory; name the directory that holds the data"
    elif not os.access(path, os.R_OK | os.X_OK):
        yield (f"data.path: {where} cannot be read by the server (user {os.getuid()}); grant "
               "read access, or copy the data somewhere readable")
    elif not config.data.allow_empty and _holds_no_data(path, config.data.manifest.extensions):
        yield empty_data_problem(where, config.data.manifest.extensions)


def _holds_no_data(path: Path, extensions: Sequence[str] | None) -> bool:
    """True when the manifest would count no file under `path`: found by a walk that stops
    at the first counted file and after MAX_CHECK_ENTRIES entries. What it cannot decide
    in that bound, or cannot walk, the scan before the launch decides (and reports)."""
    try:
        return first_counted_file(path, extensions) is False
    except ConfigError:
        return False  # an unreadable folder below it: the scan's failure names it


def _capacity_problems(config: ExperimentConfig, capacity: ClusterCapacity) -> Iterator[str]:
    resources = config.resources
    if resources.gpus_per_replica == 0:
        if resources.replicas > capacity.slots:
            yield (f"resources.replicas: a trial needs {count(resources.replicas, 'slot')} at "
                   f"once, and this server has {count(capacity.slots, 'slot')} in all, so it "
                   "would wait forever; lower resources.replicas, or start the server with "
                   "more (`muster up --slots N`)")
        return
    needed = resources.replicas * resources.gpus_per_replica
    wanted = resources.gpu_type
    have = capacity.gpus.get(wanted, 0) if wanted else sum(capacity.gpus.values())
    kind = f"{wanted} GPU" if wanted else "GPU"
    if have >= needed:
        return
    key = "resources.gpu_type" if wanted and not have else "resources.gpus_per_replica"
    types = ", ".join(f"{n} {t}" for t, n in sorted(capacity.gpus.items())) or "none"
    yield (f"{key}: a trial needs {count(needed, kind)} ({resources.replicas} replicas x "
           f"{resources.gpus_per_replica}), and this server has {count(have, kind)} (its "
           f"GPUs: {types}), so it would wait forever; ask for fewer, or a type it has")
