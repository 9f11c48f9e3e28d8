"""The git state of an experiment's context (issue 17): captured by the client, checked and
kept by the server, read into the trial snapshot's `code.git`.

Where the context directory lies in a git work tree, the client sends the upload form's
`git` field, a JSON object:

    {"commit": "<40 or 64 lowercase hex digits>", "branch": str | null, "dirty": bool,
     "diff": str | null, "diff_sha256": str | null, "diff_truncated": bool}

- `commit` is `git rev-parse HEAD`; `branch` is `git symbolic-ref --short HEAD`, null when
  HEAD is detached;
- `dirty`: under the context, a tracked file differs from HEAD or an untracked file is not
  ignored (`git status --porcelain`);
- `diff` is `git diff HEAD --binary` of the context's tracked files, with paths from the
  repository's root (it applies to a checkout of `commit`), null when there is none. It is
  sent when it is UTF-8 text of at most MAX_DIFF_BYTES and the field stays within
  MAX_FIELD_BYTES; otherwise `diff` is null, `diff_sha256` is the whole diff's sha256 and
  `diff_truncated` is true. Untracked files are in the context snapshot, not in the diff.

Capturing never stops a submission: without git, outside a work tree, before the first
commit, or when git fails or takes over GIT_TIMEOUT_S in all, the context goes without a
git state. The server keeps the record beside the context snapshot (`Home.context_git_file`,
without the diff's text) and the diff's bytes as a file of their own (`Home.context_diff_file`),
whose sha256 the record names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any, TypedDict

from muster.atomic import atomic_write_bytes, atomic_write_json, read_json, read_regular
from muster.errors import InvalidRequest, PayloadTooLarge
from muster.home import Home
from muster.sizes import format_size

__all__ = ["GIT_TIMEOUT_S", "MAX_BRANCH_CHARS", "MAX_DIFF_BYTES", "MAX_FIELD_BYTES",
           "GitSnapshot", "GitState", "capture", "copy", "field_too_large", "load", "parse_field",
           "save"]

log = logging.getLogger(__name__)

MAX_DIFF_BYTES = 1024**2
MAX_FIELD_BYTES = MAX_DIFF_BYTES + 100 * 1024  # the diff, JSON-escaped, and the rest
MAX_BRANCH_CHARS = 255
GIT_TIMEOUT_S = 5.0

_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_KEYS = ("commit", "branch", "dirty", "diff", "diff_sha256", "diff_truncated")
_SHAPE = ('send {"commit": "<40 or 64 lowercase hex>", "branch": "main" or null, "dirty": '
          'false, "diff": null, "diff_sha256": null, "diff_truncated": false}')
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
# Whatever the user's config says, one state gives one diff (and one sha256) for everyone.
_DIFF = ("-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c",
         "diff.relative=false", "-c", "diff.suppressBlankEmpty=false", "-c",
         "core.quotePath=true", "diff", "HEAD", "--binary", "--full-index", "--no-color",
         "--no-ext-diff", "--no-textconv", "--no-renames", "--diff-algorithm=myers",
         "--indent-heuristic", "--unified=3", "--inter-hunk-context=0", "--submodule=short",
         "--src-prefix=a/", "--dst-prefix=b/", "--", ".")


class GitSnapshot(TypedDict):
    """The trial snapshot's `code.git`: the state without the diff's text."""

    commit: str
    branch: str | None
    dirty: bool
    diff_sha256: str | None


@dataclass(frozen=True)
class GitState:
    """A context's git state; `diff` is the diff's text, when it was sent."""

    commit: str
    branch: str | None
    dirty: bool
    diff: str | None = None
    diff_sha256: str | None = None
    diff_truncated: bool = False

    def field(self) -> str:
        """The upload form's `git` field."""
        return json.dumps(asdict(self), ensure_ascii=False)

    def snapshot(self) -> GitSnapshot:
        """The trial snapshot's `code.git` (`muster.diagnostics`)."""
        return GitSnapshot(commit=self.commit, branch=self.branch, dirty=self.dirty,
                           diff_sha256=self.diff_sha256)


# -- the server: the form's field, and the files beside the context snapshot -------------


def parse_field(raw: bytes) -> GitState:
    """The form's `git` field, checked.

    Raises:
        PayloadTooLarge: it is over MAX_FIELD_BYTES.
        InvalidRequest: it is not the JSON object above; the message names the key.
    """
    if len(raw) > MAX_FIELD_BYTES:
        raise field_too_large()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError too)
        raise InvalidRequest(f"the `git` field is not JSON text ({exc}); {_SHAPE}") from exc
    return _checked(data, kept=False)


def field_too_large() -> PayloadTooLarge:
    """The answer to a `git` field over MAX_FIELD_BYTES (the form's reader checks as the
    bytes arrive)."""
    return PayloadTooLarge(
        f"the `git` field is larger than {format_size(MAX_FIELD_BYTES)}; a diff over "
        f"{format_size(MAX_DIFF_BYTES)} goes as its sha256 alone (`diff_truncated`)")


def save(home: Home, experiment_uuid: str, state: GitState) -> None:
    """Keep `state` beside the experiment's context snapshot: the diff first, then the
    record that names it (both atomic, 0600)."""
    if state.diff is not None:
        atomic_write_bytes(home.context_diff_file(experiment_uuid), state.diff.encode(), 0o600)
    record = {key: value for key, value in asdict(state).items() if key != "diff"}
    atomic_write_json(home.context_git_file(experiment_uuid), record, 0o600)


def load(home: Home, experiment_uuid: str) -> GitState | None:
    """The git state kept for the experiment (without the diff's text), or None when it has
    none; an unreadable or malformed record is logged and taken for none."""
    path = home.context_git_file(experiment_uuid)
    try:
        data = read_json(path)
        return None if data is None else _checked(data, kept=True)
    except (OSError, ValueError, InvalidRequest) as exc:
        log.warning("the git state kept at %s cannot be read: %s", path, exc)
        return None


def copy(home: Home, source_uuid: str, target_uuid: str) -> None:
    """Experiment `source_uuid`'s git state, for `target_uuid`, which reuses its context
    snapshot (run again); nothing when it has none."""
    for where in (home.context_diff_file, home.context_git_file):  # the record last
        path = where(source_uuid)
        if path.is_file():
            atomic_write_bytes(where(target_uuid), read_regular(path), 0o600)


def _checked(data: Any, *, kept: bool) -> GitState:
    """`data` as a GitState; a kept record has no `diff` key (its text is a file)."""
    if not isinstance(data, dict):
        raise InvalidRequest(f"the `git` field must be a JSON object; {_SHAPE}")
    unknown = sorted(set(data) - (set(_KEYS) - ({"diff"} if kept else set())))
    if unknown:
        raise InvalidRequest(f"the `git` field has the unknown key {unknown[0][:40]!r}; "
                             f"{_SHAPE}")
    state = GitState(
        commit=_text(data, "commit", _OBJECT_ID.fullmatch, "a git object id (40 or 64 "
                     "lowercase hex digits, `git rev-parse HEAD`)", required=True),
        branch=_text(data, "branch", _is_branch, f"a branch name of at most "
                     f"{MAX_BRANCH_CHARS} characters, or null"),
        dirty=_flag(data, "dirty", required=True),
        diff=None if kept else _text(data, "diff", _is_diff, f"the diff as text of at "
                                     f"most {format_size(MAX_DIFF_BYTES)}, or null"),
        diff_sha256=_text(data, "diff_sha256", _SHA256.fullmatch, "a sha256 (64 lowercase "
                          "hex digits), or null"),
        diff_truncated=_flag(data, "diff_truncated"))
    return _consistent(state, kept=kept)


def _consistent(state: GitState, *, kept: bool) -> GitState:
    """`state` with the diff's sha256 filled in, once its parts agree."""
    has_diff = state.diff is not None or state.diff_sha256 is not None
    if has_diff and not state.dirty:
        raise InvalidRequest("the `git` field has a diff, yet `dirty` is false")
    if state.diff_truncated and (state.diff is not None or state.diff_sha256 is None):
        raise InvalidRequest("the `git` field's `diff_truncated` is true, so `diff` must be "
                             "null and `diff_sha256` the whole diff's sha256")
    if state.diff is None:
        if not (kept or state.diff_truncated or state.diff_sha256 is None):
            raise InvalidRequest("the `git` field has a `diff_sha256` without its `diff`; "
                                 "send the diff, or `diff_truncated`: true")
        return state
    digest = hashlib.sha256(state.diff.encode()).hexdigest()
    if state.diff_sha256 not in (None, digest):
        raise InvalidRequest("the `git` field's `diff_sha256` is not the sha256 of its "
                             "`diff` (UTF-8)")
    return replace(state, diff_sha256=digest)


def _text(data: dict[str, object], key: str, valid: Callable[[str], object], what: str, *,
          required: bool = False) -> Any:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not valid(value):
        shown = "missing" if value is None else f"got {_shown(value)}"
        raise InvalidRequest(f"the `git` field's `{key}` must be {what}, {shown}")
    return value


def _flag(data: dict[str, object], key: str, *, required: bool = False) -> bool:
    value = data.get(key, None if required else False)
    if not isinstance(value, bool):
        shown = "missing" if value is None else f"got {_shown(value)}"
        raise InvalidRequest(f"the `git` field's `{key}` must be true or false, {shown}")
    return value


def _is_branch(value: str) -> bool:
    return (0 < len(value) <= MAX_BRANCH_CHARS and not _CONTROL.search(value)
            and _utf8(value) is not None)


def _is_diff(value: str) -> bool:
    encoded = _utf8(value)
    return encoded is not None and 0 < len(encoded) <= MAX_DIFF_BYTES


def _utf8(value: str) -> bytes | None:
    """`value` as UTF-8; None for text JSON can carry but UTF-8 cannot (a lone surrogate)."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "..."


# -- the client: reading the state from git --------------------------------------------


class _NoState(Exception):
    """The directory has no git state to record (not in a work tree, no commit yet)."""


def capture(directory: Path) -> GitState | None:
    """The git state of the context `directory`, or None where it has none or git fails
    (logged, never raised: a submission does not depend on it)."""
    if shutil.which("git") is None:
        log.debug("context %s: no git on PATH, its git state is not recorded", directory)
        return None
    try:
        return _Git(directory, time.monotonic() + GIT_TIMEOUT_S).state()
    except _NoState as exc:
        log.debug("context %s: no git state recorded (%s)", directory, exc)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("context %s: its git state is not recorded (%s)", directory, exc)
    return None


@dataclass(frozen=True)
class _Git:
    """git, run in the context directory, every call within one deadline."""

    directory: Path
    deadline: float

    def state(self) -> GitState:
        inside = self._run("rev-parse", "--is-inside-work-tree", check=False)
        if inside.returncode != 0 or inside.stdout.strip() != b"true":
            raise _NoState("not in a git work tree")
        head = self._run("rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
        if head.returncode != 0:
            raise _NoState("the repository has no commit yet")
        named = self._run("symbolic-ref", "--quiet", "--short", "HEAD", check=False)
        dirty = self._run("status", "--porcelain", "-z", "--untracked-files=normal",
                          "--", ".").stdout != b""
        diff, digest, size = self._diff()
        state = GitState(head.stdout.strip().decode("ascii"),
                         _branch(named.stdout) if named.returncode == 0 else None,
                         dirty or size > 0)
        return _with_diff(state, diff, digest, size)

    def _diff(self) -> tuple[bytes | None, str, int]:
        """The diff against HEAD (None when over MAX_DIFF_BYTES), its sha256 and size;
        written to a file first, so a large one is hashed without being held."""
        with tempfile.TemporaryFile() as out:
            self._run(*_DIFF, stdout=out)
            size = os.fstat(out.fileno()).st_size
            out.seek(0)
            digest = hashlib.file_digest(out, "sha256").hexdigest()
            out.seek(0)
            return (out.read() if size <= MAX_DIFF_BYTES else None), digest, size

    def _run(self, *args: str, check: bool = True, stdout: IO[bytes] | int = subprocess.PIPE
             ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["git", *args], cwd=self.directory, env={**os.environ, **_GIT_ENV}, check=check,
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE,
            timeout=max(0.001, self.deadline - time.monotonic()))


def _branch(raw: bytes) -> str | None:
    """The branch `git symbolic-ref --short` printed, where the form can carry it."""
    try:
        name = raw.strip().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if _is_branch(name) else None


def _with_diff(state: GitState, diff: bytes | None, digest: str, size: int) -> GitState:
    """`state` with its diff: the text where it is UTF-8 and the field stays within
    MAX_FIELD_BYTES, else the sha256 alone (`diff_truncated`)."""
    if size == 0:
        return state
    truncated = replace(state, diff_sha256=digest, diff_truncated=True)
    try:
        text = diff.decode("utf-8") if diff is not None else None
    except UnicodeDecodeError:
        return truncated
    if text is None:
        return truncated
    whole = replace(state, diff=text, diff_sha256=digest)
    return whole if len(whole.field().encode()) <= MAX_FIELD_BYTES else truncated
