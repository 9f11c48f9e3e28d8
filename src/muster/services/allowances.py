"""What a submitter may make the server itself read, write or run: the allow-lists.

The server acts as itself (root, under `run_as`) on some of what a config names: it reads
`env:` and `file:` secrets and storage keys, writes checkpoints to `checkpoint_storage.path`,
sends S3 requests (signed with the keys it read) to `endpoint_url`, runs
`environment.python` to learn what it is, and scans `data.path`. An admin may name
anything there; anyone else only what the cluster config allows:

- `environment.secrets.*`, `checkpoint_storage.access_key` and `secret_key`: `submit`, or
  an `env:`/`file:` source that `secret_sources` lists (a path there may end in `*`);
- `checkpoint_storage.path`: the cluster config's own, or under one of `storage_paths`;
- `checkpoint_storage.endpoint_url`: the cluster config's own, or one of `storage_endpoints`;
- `environment.python`: one of `interpreters`, owned by root (or the server's own user) in
  directories only they can write;
- `data.path`: a path inside the context, or under one of `data_roots`.

Whoever submits, a `file:` source never names a file in `$MUSTER_HOME` (its token, its
database, submitted secrets), an absolute `data.path` is never under `$MUSTER_HOME`, and a
relative one never leads out of the context. A path is judged as written (normalised) and
where it leads (links resolved): both must be allowed.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from muster.config import ClusterConfig, ExperimentConfig
from muster.config.secrets import SecretSource, source_of
from muster.containment import inside
from muster.job_secrets import home_file_problem
from muster.services.access import Principal

__all__ = ["Allowances", "allowance_problems"]

_ASK = "ask an admin to add it to {key} in the cluster config, or {instead}"


@dataclass(frozen=True)
class Allowances:
    """The cluster config's allow-lists, with its own storage (always allowed)."""

    secret_sources: tuple[str, ...] = ()
    data_roots: tuple[str, ...] = ()
    storage_paths: tuple[str, ...] = ()
    storage_endpoints: tuple[str, ...] = ()
    interpreters: tuple[str, ...] = ()
    package_sources: tuple[str, ...] = ()  # besides the configured index (environments.sources)

    @classmethod
    def of(cls, cluster: ClusterConfig) -> Allowances:
        own = cluster.checkpoint_storage
        paths = [own.path] if own is not None and own.path else []
        endpoints = [own.endpoint_url] if own is not None and own.endpoint_url else []
        return cls(tuple(cluster.secret_sources), tuple(cluster.data_roots),
                   tuple(paths + cluster.storage_paths),
                   tuple(endpoints + cluster.storage_endpoints), tuple(cluster.interpreters),
                   tuple(cluster.package_sources))


def allowance_problems(config: ExperimentConfig, who: Principal, allowed: Allowances,
                       home: Path) -> list[str]:
    """Every key of `config` that makes the server act where `who` may not, one line each
    with the key path, the rule and what to do instead (empty: nothing to refuse). Made
    before anything is read or written; a relative `data.path` is checked against the
    context once it is unpacked (`muster.services.submission`).

    Args:
        home: `$MUSTER_HOME`, which no config may reach.
    """
    problems = list(_secret_problems(config, who, allowed, home))
    if not who.is_admin:
        problems += _storage_problems(config, allowed)
        problems += _interpreter_problems(config, allowed)
    problems += _data_problems(config, who, allowed, home)
    return problems


def _secret_problems(config: ExperimentConfig, who: Principal, allowed: Allowances,
                     home: Path) -> Iterator[str]:
    storage = config.checkpoint_storage
    named = [(f"environment.secrets.{name}", text)
             for name, text in config.environment.secrets.items()]
    named += [(f"checkpoint_storage.{key}", text) for key in ("access_key", "secret_key")
              if (text := getattr(storage, key)) is not None]
    for key, text in named:
        source = source_of(text)
        if source.kind == "submit":
            continue
        if problem := home_file_problem(source, home):
            yield f"{key}: {problem}"
        elif not who.is_admin and not _source_allowed(source, allowed.secret_sources):
            yield (f"{key}: {text!r} makes the server read {source.describe()}, which only "
                   "admins may name unless the cluster config's secret_sources lists it; "
                   + _ASK.format(key="secret_sources",
                                 instead="send the value with the submission (`submit`)"))


def _source_allowed(source: SecretSource, allowed: Iterable[str]) -> bool:
    if source.kind == "env":
        return f"env:{source.where}" in allowed
    written, real = os.path.normpath(source.where), os.path.realpath(source.where)
    patterns = [entry.removeprefix("file:") for entry in allowed if entry.startswith("file:")]
    return (any(fnmatch.fnmatchcase(written, p) for p in patterns)
            and any(fnmatch.fnmatchcase(real, os.path.realpath(p)) or
                    fnmatch.fnmatchcase(real, p) for p in patterns))


def _storage_problems(config: ExperimentConfig, allowed: Allowances) -> Iterator[str]:
    storage = config.checkpoint_storage
    if storage.path is not None and not inside(storage.path, allowed.storage_paths):
        yield ("checkpoint_storage.path: the server writes checkpoints there as itself, so "
               f"a user may name only the cluster's storage or a directory under its "
               f"storage_paths ({_listed(allowed.storage_paths)}); "
               + _ASK.format(key="storage_paths",
                             instead="leave path out to use the cluster's storage"))
    endpoint = storage.endpoint_url
    if endpoint is not None and _endpoint(endpoint) not in {
            _endpoint(e) for e in allowed.storage_endpoints}:
        yield ("checkpoint_storage.endpoint_url: the server sends S3 requests, signed with "
               "its credentials, to that address, so a user may name only the cluster's "
               f"endpoint or one of its storage_endpoints ({_listed(allowed.storage_endpoints)}"
               "); " + _ASK.format(key="storage_endpoints",
                                  instead="leave endpoint_url out"))


def _endpoint(url: str) -> str:
    return url.rstrip("/").lower()


def _interpreter_problems(config: ExperimentConfig, allowed: Allowances) -> Iterator[str]:
    python = config.environment.python
    if python is None:
        return
    if os.path.normpath(python) not in {os.path.normpath(p) for p in allowed.interpreters}:
        yield ("environment.python: the server runs the interpreter to learn what it is, so "
               "a user may name only one the cluster config's interpreters lists "
               f"({_listed(allowed.interpreters)}); "
               + _ASK.format(key="interpreters", instead="leave it out to run on muster's own "
                             "interpreter, with environment.pip for what the script needs"))
        return
    if writer := _writable_by_others(python):
        yield (f"environment.python: {python} is allowed, but {writer}, so a job could change "
               "what the server runs; an admin must make it and every directory above it "
               "root's, writable by root alone")


def _writable_by_others(path: str) -> str:
    """How someone other than root (or the server's own user) could change `path` or what
    it leads to ("" when nobody can)."""
    trusted = {0, os.geteuid()}
    real = os.path.realpath(path)
    for each in dict.fromkeys([path, real, *_parents(path), *_parents(real)]):
        try:
            st = os.stat(each)
        except OSError as exc:
            return f"{each} cannot be examined ({exc.strerror or exc})"
        if st.st_uid not in trusted:
            return f"{each} belongs to uid {st.st_uid}"
        # In a sticky directory (/tmp) others may add names, not rename or remove root's.
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not sticky:
            return f"{each} is writable by its group or by everyone"
    return ""


def _parents(path: str) -> list[str]:
    return [str(p) for p in Path(os.path.normpath(path)).parents]


def _data_problems(config: ExperimentConfig, who: Principal, allowed: Allowances,
                   home: Path) -> Iterator[str]:
    if config.data is None or not config.data.path.startswith(("/", "~")):
        return
    written = config.data.path
    path = os.path.expanduser(written) if written.startswith("~") else written
    if inside(path, [str(home)]):
        yield (f"data.path: {written!r} is in the server's home ($MUSTER_HOME), which no "
               "job's data may be; copy the data elsewhere")
    elif not who.is_admin and not inside(path, allowed.data_roots):
        yield (f"data.path: the server scans {written!r} as itself before the first launch, "
               "so outside the context a user may name only a directory under the cluster "
               f"config's data_roots ({_listed(allowed.data_roots)}); "
               + _ASK.format(key="data_roots", instead="upload the data with the context"))


def _listed(entries: Iterable[str]) -> str:
    shown = ", ".join(entries)
    return f"now: {shown}" if shown else "it lists none"
