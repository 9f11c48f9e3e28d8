"""Where a user's environment may fetch packages from: the configured index and the
cluster config's `package_sources`.

A build's uv fetches whatever its requirement lines name, from wherever the build runs
(the server's machine, whose loopback and private network a user's browser cannot reach):
a direct URL (`x @ http://127.0.0.1:8080/x.whl`, `git+https://…`), or an index option
(`--index-url`, `--extra-index-url`, `-i`, `--find-links`, `-f`, `--index`,
`--default-index`). For a user who is not an admin, each place a line names must be on a
host of an allowed source, and each local path (`-e`, `--find-links`, a wheel) must
lie inside the submitted context: the server reads those too (a wheel's bytes go into the
hash). Admins may name anything.

The allowed sources are the configured index (what the server's uv uses: the
`UV_DEFAULT_INDEX` or `UV_INDEX_URL` of the server's environment, else PyPI, whose files
come from files.pythonhosted.org; with `UV_EXTRA_INDEX_URL`, `UV_INDEX` and
`UV_FIND_LINKS` too) and each `package_sources` entry: a URL (its host and port are
allowed) or a bare host (any port on it). The check is a pure function of the lines, the
context and the lists (`package_source_problems`), table-tested.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from muster.config import ExperimentConfig
from muster.environments.request import CONSTRAINT, read_requirements

__all__ = ["PYPI", "configured_sources", "package_source_problems"]

PYPI = ("https://pypi.org/simple", "https://files.pythonhosted.org")
_ASK = ("ask an admin to add it to package_sources in the cluster config, or install from "
        "{allowed}")
# Options whose value is a place to fetch from (an index, or links: a URL or a directory).
_INDEX_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "--index",
                            "--default-index", "-f", "--find-links"})
# Options whose value is a local directory or a URL (`-r` and `-c` are read in already:
# `request` keeps them inside the context).
_PATH_OPTIONS = frozenset({"-e", "--editable"})
# Options that name nothing to fetch or read.
_PLAIN_OPTIONS = frozenset({"--no-index", "--pre", "--prefer-binary", "--no-binary",
                            "--only-binary", "--hash", "--no-deps", "--trusted-host",
                            "--config-settings", "--config-setting"})
_VALUED = _INDEX_OPTIONS | _PATH_OPTIONS | {"--no-binary", "--only-binary", "--hash",
                                            "--trusted-host", "--config-settings",
                                            "--config-setting"}
_DIRECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*@\s*(?P<target>[^\s;]+)")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ssh": 22, "git": 9418}


@dataclass(frozen=True)
class _Host:
    name: str
    port: int | None  # None: any port (a bare host in package_sources)

    def allows(self, other: _Host) -> bool:
        return self.name == other.name and self.port in (None, other.port)

    def __str__(self) -> str:
        return self.name if self.port is None else f"{self.name}:{self.port}"


def configured_sources(environ: Mapping[str, str]) -> list[str]:
    """The indexes the server's uv is configured with (`UV_*` of `environ`), else PyPI's."""
    found: list[str] = []
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if environ.get(name):
            found.append(environ[name])
    primary = bool(found)
    for name in ("UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_FIND_LINKS"):
        for entry in re.split(r"[\s,]+", environ.get(name, "")):
            if entry:
                found.append(entry.split("=", 1)[1] if re.match(r"^[\w-]+=", entry) else entry)
    return found if primary else [*PYPI, *found]


def package_source_problems(config: ExperimentConfig, context: Path,
                            allowed: Sequence[str],
                            environ: Mapping[str, str] | None = None) -> list[str]:
    """What `config`'s requirement lines (`environment.pip`, then the requirements file
    read in the `context`) name outside the configured index (of `environ`, by default the
    server's) and the `allowed` package sources, one line per problem.

    Raises:
        RequestError: the requirements file cannot be read.
    """
    sources = [*configured_sources(os.environ if environ is None else environ), *allowed]
    hosts = [host for host in map(_host, sources) if host is not None]
    named = ", ".join(sources)
    pip = len(config.environment.pip)
    problems = []
    for number, line in enumerate(read_requirements(config, context)):
        where = (f"environment.pip[{number}]" if number < pip
                 else f"environment.requirements ({config.environment.requirements})")
        for problem in line_problems(line.removeprefix(CONSTRAINT), context, hosts):
            problems.append(f"{where}: {line[:200]!r} {problem}; "
                            + _ASK.format(allowed=named))
    return problems


def line_problems(line: str, context: Path, hosts: Sequence[_Host]) -> Iterator[str]:
    """What one requirement line names that is not allowed (see the module)."""
    tokens = line.split()
    if not tokens:
        return
    direct = _DIRECT.match(line)
    if not tokens[0].startswith("-"):
        target = direct.group("target") if direct else tokens[0]
        yield from _target_problems(target, context, hosts, local_ok=True)
        tokens = tokens[1 if direct is None else len(direct.group(0).split()):]
    position = 0
    while position < len(tokens):
        option, value, position = _option(tokens, position)
        if option is None:
            continue
        if option not in _VALUED and option not in _PLAIN_OPTIONS:
            yield f"gives the option {option}, which a user may not give"
        elif value is None and option in _VALUED:
            yield f"gives {option} without a value"
        elif option in _INDEX_OPTIONS and value is not None:
            yield from _target_problems(value, context, hosts, local_ok=option in ("-f",
                                                                                   "--find-links"))
        elif option in _PATH_OPTIONS and value is not None:
            yield from _target_problems(value, context, hosts, local_ok=True)


def _option(tokens: Sequence[str], position: int) -> tuple[str | None, str | None, int]:
    """(option, its value, the next position) at `position`; (None, None, next) for a
    token that is not an option (a per-requirement marker or hash, say)."""
    token = tokens[position]
    if not token.startswith("-"):
        return None, None, position + 1
    if "=" in token and token.startswith("--"):
        option, attached = token.split("=", 1)
        return option, attached, position + 1
    if not token.startswith("--") and len(token) > 2:  # -ihttp://…
        return token[:2], token[2:], position + 1
    if token in _VALUED:
        following = tokens[position + 1] if position + 1 < len(tokens) else None
        return token, following, position + 2
    return token, None, position + 1


def _target_problems(target: str, context: Path, hosts: Sequence[_Host],
                     local_ok: bool) -> Iterator[str]:
    """What is wrong with one place a line names: a URL off the allowed hosts, or a local
    path outside the context."""
    scheme = urlsplit(target).scheme.lower()
    if scheme == "file":
        target = urlsplit(target).path or "/"
    elif "://" in target or scheme.startswith(("git+", "hg+", "svn+", "bzr+")):
        host = _host(target)
        if host is None:
            yield "names a URL without a host"
        elif not any(allowed.allows(host) for allowed in hosts):
            yield f"fetches from {host}, which is not a package source of this server"
        return
    elif not target.startswith((".", "/", "~")) and os.sep not in target:
        return  # a package name and its version, from the index
    if not local_ok:
        yield f"names the local path {target!r} where an index is expected"
    elif not _inside(target, context):
        yield (f"names the local path {target!r}, which is outside the submitted context "
               "(the server reads it)")


def _inside(path: str, context: Path) -> bool:
    if path.startswith("~"):
        return False
    root = os.path.realpath(context)
    resolved = os.path.realpath(os.path.join(root, path))
    return resolved == root or resolved.startswith(root + os.sep)


def _host(source: str) -> _Host | None:
    """The host (and port) of a source: a URL, or a bare `host[:port]`."""
    if "://" not in source:
        source = "//" + source
        parts = urlsplit(source)
        try:
            port = parts.port
        except ValueError:
            return None
        return _Host(parts.hostname, port) if parts.hostname else None
    parts = urlsplit(source)
    scheme = parts.scheme.lower().split("+")[-1]
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    return _Host(parts.hostname, port) if parts.hostname else None
