"""Under the cluster config's `run_as`: who owns what of a trial's run directory.

The trial's own directories are its account's, 0700: its working directory, its environment
layer (so `pip install` works), its checkpoints, the copy of its warm start's checkpoint
(`source/<name>/`) and each attempt's directory (where the
harness writes its heartbeat, metrics and samples, and the shim, as root, its log and exit
record). The run directory itself stays root's, 0711 (entered, not listed): nothing of the
job's can stand in for a directory muster makes there later, so muster never creates,
writes or changes the owner of something through a link the job planted. Files muster
writes for the job to read (the hyperparameters, a warm standby's go file) are root's and
readable (0644) inside those private directories. The files of the working directory are
hard links to the context snapshot's, shared by the experiment's trials (`workdir`): they
stay root's, read-only (0444, or 0555 for a script), so a job replaces such a file, never
writes through it; only the job's own directories lead to them.

What muster reads back from these directories it opens without following links
(`muster.atomic.read_json`, the log readers, ingestion, the checkpoint rule), and the shim
starts only from a spec that root wrote.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from muster.errors import LaunchError
from muster.launch.accounts import Account
from muster.rundir import AttemptDir, RunDir

__all__ = ["grant_attempt", "grant_trial", "readable_by_job"]

RUN_DIR_MODE = 0o711
PRIVATE = 0o700
READABLE = 0o644
SHARED = 0o444  # a file linked from the snapshot: read-only for everyone (+x for a script)


def grant_trial(run_dir: RunDir, account: Account) -> None:
    """Give the trial's working directory, environment layer and checkpoints to `account`
    (once: trees already its own are left as they are).

    Raises:
        LaunchError: the ownership could not be changed (not root, a read-only disk).
    """
    try:
        os.chown(run_dir.path, 0, 0)
        os.chmod(run_dir.path, RUN_DIR_MODE)
        run_dir.checkpoints.mkdir(mode=PRIVATE, exist_ok=True)
        for tree in (run_dir.workdir, run_dir.env, run_dir.checkpoints, *_copies(run_dir)):
            if tree.is_dir() and tree.lstat().st_uid != account.uid:
                _give_tree(tree, account)
    except OSError as exc:
        raise LaunchError(f"Could not give the run directory {run_dir.path} to Unix account "
                          f"{account.name} (run_as): {exc}") from exc


def _copies(run_dir: RunDir) -> list[Path]:
    """The warm start's copies in `source/` (`muster.supervise.warm_start`), which the job
    reads and may change; `source/` itself stays root's (0711), so what muster copies in
    there later never goes through a link the job planted."""
    if not run_dir.source.is_dir() or run_dir.source.is_symlink():
        return []
    os.chown(run_dir.source, 0, 0)
    os.chmod(run_dir.source, RUN_DIR_MODE)
    return [Path(entry.path) for entry in os.scandir(run_dir.source)
            if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")]


def _give_tree(top: Path, account: Account) -> None:
    """Everything under `top` (made by muster, link-free) becomes the account's, except
    files linked from elsewhere (the snapshot's): those stay root's and read-only. Links
    are changed themselves, never followed."""
    for here, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(here, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                os.chmod(path, SHARED | (0o111 if info.st_mode & 0o111 else 0))
            else:
                os.chown(path, account.uid, account.gid, follow_symlinks=False)
        for name in dirs:
            os.chown(os.path.join(here, name), account.uid, account.gid,
                     follow_symlinks=False)
    os.chown(top, account.uid, account.gid)
    os.chmod(top, PRIVATE)


def grant_attempt(attempt_dir: AttemptDir, account: Account) -> None:
    """Give a new attempt's directory to `account`; its hyperparameters stay root's, readable.

    Raises:
        LaunchError: as `grant_trial`.
    """
    try:
        readable_by_job(attempt_dir.hparams)
        os.chown(attempt_dir.path, account.uid, account.gid)
        os.chmod(attempt_dir.path, PRIVATE)
    except OSError as exc:
        raise LaunchError(f"Could not give the attempt directory {attempt_dir.path} to Unix "
                          f"account {account.name} (run_as): {exc}") from exc


def readable_by_job(path: Path) -> None:
    """Let the job read a file muster wrote for it (it stays root's). Only for a file in a
    directory the job cannot write yet: elsewhere, write it readable in the first place
    (`atomic_write_bytes(..., exact_mode=True)`), never chmod it by its path."""
    os.chmod(path, READABLE)
