"""What an experiment's `environment:` block asks muster to build, and its content hash.

The hash names the build (`$MUSTER_HOME/envs/<hash>`): one build per hash, shared by every
trial that needs it. It covers everything the result depends on that muster can see: the
base interpreter (its real binary, its venv, and — when inherited — the packages it
imports), `inherit`, the requirement lines after `-r` includes are read in, the setup
commands, and the bytes of local wheels and archives the lines name.

The base is `environment.python` when the experiment names one. Without it, an environment
that inherits stands on what trials without an environment block stand on, the runtime
base or the cluster config's `base_environment` (`runtime_base`), never muster's own venv
(its server, test and CLI packages would be importable again), and the hash covers that
base's key as well (`BuildRequest.based_on`): a new base is a new build. A clean one
(`inherit: false`) needs only an interpreter binary: muster's, as before.

Under `run_as`, it covers the account that builds it too, and only trials of that account
run in the build. The build runs as that account (`build`), so the account can change what
it built, during the build and after it (a process it left running, a file it holds open
for writing): a build another account's trials shared would be code that account planted
in theirs. Re-owning the tree to root before publishing would not close that (an open
descriptor outlives a chown; uv's hard links from the account's cache would be re-owned
with it), so each account gets its own build of a request instead. Without `run_as` the
hash is what it always was.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NotRequired, TypedDict

from muster.config import ExperimentConfig
from muster.environments.interpreters import (
    Interpreter,
    InterpreterError,
    InterpreterJson,
    inspect,
    own,
)
from muster.environments.layout import HASH_CHARS
from muster.environments.runtime_base import RuntimeBase, RuntimeBaseError
from muster.launch.accounts import Account, AccountJson, account_from_json

__all__ = ["CONSTRAINT", "LAYOUT_VERSION", "MAX_REQUIREMENT_LINES", "BuildRequest",
           "BuildRequestJson", "RequestError", "base_interpreter", "build_request",
           "read_requirements"]

LAYOUT_VERSION = 1  # bumped when a build's layout changes: every hash changes with it
MAX_REQUIREMENTS_BYTES = 1 << 20
MAX_REQUIREMENT_LINES = 10_000
MAX_INCLUDE_DEPTH = 8
_INCLUDE = re.compile(r"^(-r|--requirement|-c|--constraint)(\s*=\s*|\s+)(\S+)\s*$")
_LOCAL_FILE = re.compile(r"(?:^|@\s*)(?:file://)?(/\S+\.(?:whl|tar\.gz|zip|tgz))$")
_HASHED_FILE_BYTES = 4 << 30
CONSTRAINT = "-c "  # a line read from a constraints file: the build passes it as one


class RequestError(Exception):
    """One problem with the environment block, already worded with its key path."""


class BuildRequestJson(TypedDict):
    """A `BuildRequest` as its file holds it (`requests/<hash>.json`)."""

    key: str  # written for people; the reader computes it again
    base: InterpreterJson
    inherit: bool
    requirements: list[str]
    setup: list[list[str]]
    # Absent from a request written before each existed:
    context: NotRequired[str | None]
    files: NotRequired[dict[str, str]]
    account: NotRequired[AccountJson | None]
    based_on: NotRequired[str | None]


@dataclass(frozen=True)
class BuildRequest:
    """Everything a build needs, in plain data (stored as `requests/<hash>.json`)."""

    base: Interpreter
    inherit: bool
    requirements: tuple[str, ...]  # lines, includes read in, comments and blanks dropped
    setup: tuple[tuple[str, ...], ...]
    context: str | None  # where relative paths in the lines are read from
    files: dict[str, str] = field(default_factory=dict)  # local archive -> its sha256
    account: Account | None = None  # `run_as`: who builds it (and whose trials use it)
    # The key of the trials' base it stands on (`runtime_base.TrialBase`); None when
    # `environment.python` names the base, or nothing is inherited.
    based_on: str | None = None

    @property
    def key(self) -> str:
        identity: dict[str, object] = {
            "layout": LAYOUT_VERSION,
            "python": [self.base.executable, self.base.prefix, self.base.version],
            "inherit": self.inherit,
            "inherited": self.base.packages_digest() if self.inherit else None,
            "requirements": list(self.requirements),
            "setup": [list(argv) for argv in self.setup],
            "files": self.files,
        }
        if self.account is not None:
            identity["account"] = [self.account.name, self.account.uid]
        if self.based_on is not None:
            identity["based_on"] = self.based_on
        text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]

    def packages(self) -> list[str]:
        """The requirements, less options and constraints (what `env list` shows)."""
        return [line for line in self.requirements if not line.startswith("-")]

    def split(self) -> tuple[list[str], list[str]]:
        """(requirement and option lines, constraint lines): the build's two files."""
        constraints = [x.removeprefix(CONSTRAINT) for x in self.requirements
                       if x.startswith(CONSTRAINT)]
        return [x for x in self.requirements if not x.startswith(CONSTRAINT)], constraints

    def to_json(self) -> BuildRequestJson:
        return BuildRequestJson(
            key=self.key, base=self.base.to_json(), inherit=self.inherit,
            requirements=list(self.requirements), setup=[list(argv) for argv in self.setup],
            context=self.context, files=self.files,
            account=None if self.account is None else self.account.to_json(),
            based_on=self.based_on)

    @classmethod
    def from_json(cls, data: BuildRequestJson) -> BuildRequest:
        """Read back, each field converted."""
        base = data["base"]
        context, based_on = data.get("context"), data.get("based_on")
        return cls(base=Interpreter.from_json(base, str(base["path"])),
                   inherit=bool(data["inherit"]),
                   requirements=tuple(str(x) for x in data["requirements"]),
                   setup=tuple(tuple(str(w) for w in argv) for argv in data["setup"]),
                   context=None if context is None else str(context),
                   files={str(k): str(v) for k, v in data.get("files", {}).items()},
                   account=account_from_json(data.get("account")),
                   based_on=None if based_on is None else str(based_on))


def base_interpreter(config: ExperimentConfig, account: Account | None = None) -> Interpreter:
    """The interpreter the experiment's environment is based on (or runs on), asked as
    `account` (the one its jobs run as, under `run_as`).

    Raises:
        RequestError: `environment.python` cannot be used.
    """
    python = config.environment.python
    if python is None:
        return own()
    try:
        return inspect(python, account)
    except InterpreterError as exc:
        raise RequestError(f"environment.python: {exc}") from exc


def read_requirements(config: ExperimentConfig, context: Path) -> list[str]:
    """The requirement lines of `config`'s environment: `pip`'s, then the requirements
    file's (includes read in, inside the `context`).

    Raises:
        RequestError: the requirements file cannot be used.
    """
    env = config.environment
    lines = list(env.pip)
    if env.requirements is not None:
        lines += _read_requirements(context, PurePosixPath(env.requirements), "environment."
                                    "requirements", depth=0, total=[0])
    return lines


def build_request(config: ExperimentConfig, context: Path, account: Account | None = None,
                  *, runtime: RuntimeBase) -> BuildRequest | None:
    """What to build for `config`, read against the submitted `context`, by `account`
    (under `run_as`: the account its jobs run as); None when nothing is built (the trial
    runs on the base interpreter, under its own layer). Without `environment.python`, an
    environment that inherits is based on `runtime`, the trials' base (built now if it
    must be).

    Raises:
        RequestError: the base interpreter, the trials' base or the requirements file
            cannot be used.
    """
    env = config.environment
    named = None if env.python is None else base_interpreter(config, account)
    if not env.builds():
        return None
    inherit = env.inherit is not False
    base, based_on = named or own(), None
    if named is None and inherit:
        try:
            trials_base = runtime.base(account)
        except RuntimeBaseError as exc:
            raise RequestError(f"environment: {exc} (an environment that inherits is built "
                               "on it; inherit: false builds a clean one)") from exc
        base, based_on = trials_base.interpreter, trials_base.key
    lines = read_requirements(config, context)
    return BuildRequest(base=base, inherit=inherit, requirements=tuple(lines),
                        setup=tuple(tuple(a) for a in env.setup), context=str(context),
                        files=_local_files(lines, context), account=account,
                        based_on=based_on)


def _read_requirements(context: Path, name: PurePosixPath, where: str, depth: int,
                       total: list[int], constraint: bool = False) -> list[str]:
    """The lines of a requirements file inside the context, `-r`/`-c` includes read in
    (they stay inside the context too), comments and blank lines dropped. A constraint
    file's lines come back as `-c <line>`."""
    path = context / name
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise RequestError(f"{where}: {str(name)!r} is not in the uploaded context "
                           "directory; upload the directory that holds it, or fix the path"
                           ) from exc
    if not resolved.is_relative_to(context.resolve()):
        raise RequestError(f"{where}: {str(name)!r} points outside the context directory")
    if not resolved.is_file():
        raise RequestError(f"{where}: {str(name)!r} is not a file")
    if resolved.stat().st_size > MAX_REQUIREMENTS_BYTES:
        raise RequestError(f"{where}: {str(name)!r} is larger than 1 MiB")
    try:
        text = resolved.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestError(f"{where}: {str(name)!r} cannot be read as UTF-8 text: {exc}"
                           ) from exc
    lines: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw)
        if not line:
            continue
        total[0] += 1
        if total[0] > MAX_REQUIREMENT_LINES:
            raise RequestError(f"{where}: more than {MAX_REQUIREMENT_LINES:,} requirement "
                               "lines")
        if "\x00" in line:
            raise RequestError(f"{where}: line {number} of {str(name)!r} holds a NUL "
                               "character")
        include = _INCLUDE.match(line)
        if include is None:
            lines.append(f"{CONSTRAINT}{line}" if constraint else line)
            continue
        flag, target = include.group(1), include.group(3)
        if depth + 1 > MAX_INCLUDE_DEPTH:
            raise RequestError(f"{where}: includes nest deeper than {MAX_INCLUDE_DEPTH}")
        included = PurePosixPath(os.path.normpath(name.parent / target))
        if included.is_absolute() or included.parts[:1] == ("..",):
            raise RequestError(f"{where}: line {number} of {str(name)!r} includes {target!r}, "
                               "which is not inside the context directory")
        lines += _read_requirements(context, included, f"{where} (included from {name})",
                                    depth + 1, total,
                                    constraint or flag in ("-c", "--constraint"))
    return lines


def _strip_comment(raw: str) -> str:
    """A requirements line without its comment (` #` starts one, as pip reads it)."""
    line = raw.strip()
    if line.startswith("#"):
        return ""
    return re.split(r"\s+#", line, maxsplit=1)[0].strip()


def _local_files(lines: list[str], context: Path) -> dict[str, str]:
    """sha256 of each local wheel or archive the lines name: a rebuilt wheel of the same
    name and version is a different environment."""
    found = {}
    for line in lines:
        match = _LOCAL_FILE.search(line)
        if match is None:
            continue
        path = Path(match.group(1))
        try:
            if path.stat().st_size > _HASHED_FILE_BYTES:
                continue
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError:
            continue  # uv says what is wrong with it, in the build's log
        found[str(path)] = digest.hexdigest()
    return found
