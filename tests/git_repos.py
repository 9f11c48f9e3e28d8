"""Real git repositories for the tests of a context's git state (`muster.git_state`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Whatever the machine's config says: who commits, and no signing or hooks.
_CONFIG = ("-c", "user.name=muster tests", "-c", "user.email=tests@muster.invalid",
           "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null")


def git(repo: Path, *args: str) -> str:
    """`git ARGS` in `repo`; its stdout, stripped."""
    done = subprocess.run(["git", *_CONFIG, *args], cwd=repo, check=True, capture_output=True,
                          env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}, timeout=30)
    return done.stdout.decode().strip()


def init_repo(repo: Path, files: dict[str, str | bytes] | None = None) -> str:
    """A repository at `repo` on branch `main` with `files` in its first commit; that
    commit's id."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    write(repo, files or {"README": "a repository\n"})
    return commit(repo, "first")


def write(repo: Path, files: dict[str, str | bytes]) -> None:
    for relative, content in files.items():
        path = repo / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def commit(repo: Path, message: str) -> str:
    """Everything in `repo` committed (an empty commit when nothing changed); the id."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")
