"""A trial's reproducibility snapshot, and the diff of two trials (issue 17).

The trial part (`muster.diagnostics`) is assembled from what the store and the home hold
and never change for a trial: the experiment's context snapshot (hashed once per
experiment), its normalised config, the trial's hyperparameters and seed, its environment's
`pip freeze`, its data manifest's fingerprint. The rank parts are what the harness wrote in
each rank of the trial's latest attempt (`rank-<r>.snapshot.json`); a trial run without the
harness has none.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from muster.diagnostics import diff, read_rank_parts
from muster.environments.layout import RECORD, EnvHome
from muster.home import Home
from muster.services.experiments import trial_or_404
from muster.store import Experiment, Store, Trial
from muster.supervise.configs import experiment_config
from muster.supervise.searching import trial_seed

__all__ = ["diff_trials", "trial_snapshot"]

log = logging.getLogger(__name__)

_TREES: OrderedDict[str, dict[str, Any]] = OrderedDict()  # experiment uuid -> its code part
_TREES_KEPT = 256


def trial_snapshot(store: Store, home: Home, trial_id: int) -> dict[str, Any]:
    """`{"trial": the trial part, "ranks": {rank: the rank part}}`.

    Raises:
        NotFound: no such trial.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        part = trial_part(home, trial)
        attempts = sorted(trial.attempts, key=lambda a: a.number)
        latest = Path(attempts[-1].run_dir) if attempts else None
    ranks = read_rank_parts(latest) if latest is not None else {}
    return {"trial": part, "ranks": {str(rank): value for rank, value in ranks.items()}}


def diff_trials(store: Store, home: Home, a: int, b: int) -> dict[str, Any]:
    """What differs between trials `a` and `b` (`diff.to_json`), most relevant first."""
    first, second = trial_snapshot(store, home, a), trial_snapshot(store, home, b)
    differences = diff.diff_trials(
        diff.TrialSnapshots(first["trial"], {int(r): v for r, v in first["ranks"].items()}),
        diff.TrialSnapshots(second["trial"], {int(r): v for r, v in second["ranks"].items()}))
    return {**diff.to_json(differences), "lines": [d.line() for d in differences]}


def trial_part(home: Home, trial: Trial) -> dict[str, Any]:
    """The trial part of the snapshot (see `muster.diagnostics`), read through the trial's
    relationships in the caller's transaction."""
    experiment: Experiment = trial.experiment
    config = experiment_config(experiment)
    manifest = trial.manifest or {}
    return {
        "code": _code(home, experiment.uuid),
        "config": config.model_dump(mode="json"),
        "hparams": trial.hparams,
        "seed": trial_seed(experiment, config, trial.number),
        "environment": {"key": experiment.environment_key,
                        "packages": _packages(home, experiment.environment_key)},
        "data": {"fingerprint": manifest.get("fingerprint")},
    }


def _code(home: Home, experiment_uuid: str) -> dict[str, Any]:
    """The context snapshot's tree hash (relative paths and file hashes, sorted), computed
    once per experiment: the snapshot never changes. Git state is not recorded yet."""
    cached = _TREES.get(experiment_uuid)
    if cached is None:
        cached = {**_tree(home.context_dir(experiment_uuid)), "git": None}
        _TREES[experiment_uuid] = cached
        if len(_TREES) > _TREES_KEPT:
            _TREES.popitem(last=False)
    return cached


def _tree(root: Path) -> dict[str, Any]:
    digest, files = hashlib.sha256(), 0
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            with path.open("rb") as stream:
                content = hashlib.file_digest(stream, "sha256").hexdigest()
            digest.update(f"{path.relative_to(root).as_posix()}\0{content}\n".encode())
            files += 1
    return {"tree_sha256": digest.hexdigest(), "files": files}


def _packages(home: Home, key: str | None) -> dict[str, str] | None:
    """The environment's packages from its `pip freeze`; None when it runs on the base
    interpreter (not recorded yet) or is not built."""
    if key is None:
        return None
    built = EnvHome(home.envs_dir).built(key)
    if built is None:
        return None
    try:
        text = (built / RECORD / "freeze.txt").read_text(encoding="utf-8")
    except OSError as exc:
        log.warning("environment %s: its pip freeze cannot be read: %s", key, exc)
        return None
    packages = {}
    for line in text.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            packages[name.strip().lower()] = version.strip()
    return packages
