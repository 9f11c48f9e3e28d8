"""Where environments live under `$MUSTER_HOME/envs/` (see `muster.environments`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HASH_CHARS", "RECORD", "EnvHome", "is_hash"]

HASH_CHARS = 16  # hex digits of an environment's hash: its name everywhere
RECORD = ".muster"  # inside a built venv: env.json, freeze.txt, requirements.txt, last_used
_HASH = re.compile(f"[0-9a-f]{{{HASH_CHARS}}}")


def is_hash(text: str) -> bool:
    return bool(_HASH.fullmatch(text))


@dataclass(frozen=True)
class EnvHome:
    """The layout of `$MUSTER_HOME/envs/`."""

    root: Path

    def ensure(self, shared: bool | None = None) -> EnvHome:
        """Make the layout; `shared`: jobs run as other accounts (`run_as`) and must reach
        the built environments and the harness (0711 on the way, never listed); None (a
        build, a submission): the modes the server gave it are kept."""
        for path in (self.root, self.store, self.requests, self.logs, self.locks, self.spares):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if shared is not None:
            for path in (self.root, self.store):
                path.chmod(0o711 if shared else 0o700)
        return self

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def requests(self) -> Path:
        return self.root / "requests"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def spares(self) -> Path:
        """Trial layers made ahead of time, one per kind (`Environments.prepare`): root's,
        0700, renamed into a trial's run directory when one is needed."""
        return self.root / "spares"

    @property
    def runtime(self) -> Path:
        """Where the runtime base is built (`runtime_base`): what a trial without an
        environment block imports."""
        return self.root / "runtime"

    @property
    def runtime_current(self) -> Path:
        """The link whose presence says the runtime base is built; trials name it."""
        return self.runtime / "current"

    @property
    def harness(self) -> Path:
        """A directory holding only a link to muster's package: on a trial's path, it makes
        `import muster.harness` work without muster's dependencies (the harness needs the
        standard library alone)."""
        return self.root / "harness"

    def published(self, key: str) -> Path:
        """The link whose presence says the environment is built."""
        return self.root / key

    def built(self, key: str) -> Path | None:
        """The built venv of `key` (the published link resolved), or None."""
        link = self.published(key)
        try:
            target = link.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        return target if (target / RECORD / "env.json").is_file() else None

    def request(self, key: str) -> Path:
        return self.requests / f"{key}.json"

    def log(self, key: str) -> Path:
        return self.logs / f"{key}.log"

    def stage(self, key: str) -> Path:
        return self.logs / f"{key}.stage"

    def result(self, key: str) -> Path:
        return self.logs / f"{key}.result.json"

    def lock(self, key: str) -> Path:
        return self.locks / f"{key}.lock"

    def hashes(self) -> list[str]:
        """Every environment muster knows of: requested, built or failed."""
        found = {p.name.removesuffix(".json") for p in _listing(self.requests)}
        found |= {p.name for p in _listing(self.root) if p.is_symlink()}
        return sorted(k for k in found if is_hash(k))

    def ensure_harness(self, shared: bool = False) -> Path:
        """The harness directory, its link pointing at the muster package running now
        (readable by everyone when `shared`)."""
        import muster

        package = Path(muster.__file__).resolve().parent
        self.harness.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.harness.chmod(0o755 if shared else 0o700)
        link = self.harness / "muster"
        if not link.is_symlink() or Path(os.readlink(link)) != package:
            tmp = self.harness / f".muster.tmp-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(package)
            os.replace(tmp, link)
        return self.harness


def _listing(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except FileNotFoundError:
        return []
