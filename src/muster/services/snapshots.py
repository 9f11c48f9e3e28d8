"""A trial's reproducibility snapshot, and the diff of two trials (issue 17).

The trial part (`muster.diagnostics`) is assembled from what the store and the home hold
and never change for a trial: the experiment's context snapshot (hashed once per
experiment), its normalised config, the trial's hyperparameters and seed, its environment's
`pip freeze`, its data manifest's fingerprint. The rank parts are what the harness wrote in
each rank of the trial's latest attempt (`rank-<r>.snapshot.json`); a trial run without the
harness has none. The outside part is what the server saw of its latest attempt from
outside the process, at its launch (`muster.supervise.outside_snapshot`): a plain script's
interpreter and packages, compared by the diff too. Two experiments are compared through
one trial each: its best by the searcher's metric, else its latest (`stand_in`).
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

from muster import api, git_state
from muster.config.schema import ExperimentConfig, SearcherConfig
from muster.diagnostics import diff, read_outside_part, read_rank_parts
from muster.diagnostics.code_tree import tree_of
from muster.environments import interpreters
from muster.environments.interpreters import InterpreterError
from muster.environments.layout import RECORD, EnvHome
from muster.errors import Conflict
from muster.home import Home
from muster.rundir import AttemptDir
from muster.services import views
from muster.services.experiments import experiment_or_404, trial_or_404
from muster.services.validation import best_validation
from muster.states import Basis, TrialState
from muster.store import Experiment, Store, Trial
from muster.store.configs import experiment_config, experiment_searcher
from muster.supervise.searching import trial_seed

__all__ = ["TrialParts", "diff_experiments", "diff_trials", "stand_in",
           "trial_part", "trial_snapshot"]

log = logging.getLogger(__name__)

_TREES: OrderedDict[str, api.JsonObject] = OrderedDict()  # experiment uuid -> its code part
_TREES_KEPT = 256


def trial_snapshot(store: Store, home: Home, trial_id: int) -> api.TrialSnapshot:
    """`{"trial": the trial part, "ranks": {rank: the rank part}, "outside": the outside
    part or null}` (`muster.diagnostics`).

    Raises:
        NotFound: no such trial.
    """
    with store.session_scope() as s:
        trial = trial_or_404(s, trial_id)
        part = trial_part(home, trial)
        attempts = sorted(trial.attempts, key=lambda a: a.number)
        latest = AttemptDir(Path(attempts[-1].run_dir)) if attempts else None
        numbers = [a.number for a in attempts]
    ranks = read_rank_parts(latest.path) if latest is not None else {}
    outside = read_outside_part(latest.run, numbers) if latest is not None else None
    return {"trial": part, "ranks": {str(rank): value for rank, value in ranks.items()},
            "outside": outside}


def diff_trials(store: Store, home: Home, a: int, b: int) -> api.TrialDiff:
    """What differs between trials `a` and `b` (`diff.diff_trials`), most relevant first,
    each difference with its line."""
    first, second = trial_snapshot(store, home, a), trial_snapshot(store, home, b)
    differences = diff.diff_trials(_snapshots(first), _snapshots(second))
    return {"differences": [d.view() for d in differences],
            "lines": [d.line() for d in differences]}


def _snapshots(snapshot: api.TrialSnapshot) -> diff.TrialSnapshots:
    return diff.TrialSnapshots(snapshot["trial"],
                               {int(r): v for r, v in snapshot["ranks"].items()},
                               snapshot["outside"])


def trial_part(home: Home, trial: Trial) -> api.JsonObject:
    """The trial part of the snapshot (see `muster.diagnostics`), read through the trial's
    relationships in the caller's transaction (`TrialParts` for many trials)."""
    return TrialParts(home)(trial)


def _code(home: Home, experiment_uuid: str) -> api.JsonObject:
    """The context snapshot's tree hash (relative paths and file hashes, sorted) and its git
    state, read once per experiment: both are kept before the experiment is recorded
    (`experiments.create_experiment`) and never change."""
    cached = _TREES.get(experiment_uuid)
    if cached is None:
        cached = {**tree_of(home.context_dir(experiment_uuid)),
                  "git": _git(home, experiment_uuid)}
        _TREES[experiment_uuid] = cached
        if len(_TREES) > _TREES_KEPT:
            _TREES.popitem(last=False)
    return cached


def _git(home: Home, experiment_uuid: str) -> git_state.GitSnapshot | None:
    """The context's git state (`muster.git_state`), None when it had none."""
    state = git_state.load(home, experiment_uuid)
    return None if state is None else state.snapshot()


def _warm_start(source: api.JsonObject | None) -> api.JsonObject | None:
    """What a diff compares of a warm start: the checkpoint and what named it."""
    if source is None:
        return None
    return {key: source.get(key) for key in ("checkpoint_uuid", "checkpoint", "step",
                                              "trial_id", "model", "version")}


def _packages(home: Home, key: str | None) -> dict[str, str] | None:
    """The environment's packages from its `pip freeze`; None when it is not built."""
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


def _interpreter_packages(python: str) -> dict[str, str] | None:
    """What `python` imports, by normalized name (asked of it once, then remembered until
    its site-packages change: `muster.environments.interpreters`); None when it cannot
    say."""
    try:
        return dict(interpreters.inspect(python).packages)
    except InterpreterError as exc:
        log.warning("the interpreter %s cannot list its packages: %s", python, exc)
        return None


class TrialParts:
    """`trial_part` for the trials one answer shows (`describe`'s `part_of`): each
    experiment's config is dumped, and each environment's packages read, once per answer
    however many of its trials it shows (the code part is kept across answers, `_code`).
    One per answer: what it read is not read again."""

    def __init__(self, home: Home) -> None:
        self.home = home
        # experiment uuid -> its config (None: no longer valid) and the config as shown
        self._configs: dict[str, tuple[ExperimentConfig | None, api.Config]] = {}
        self._packages: dict[str, dict[str, str] | None] = {}  # environment key -> packages

    def __call__(self, trial: Trial) -> api.JsonObject:
        experiment: Experiment = trial.experiment
        config, shown = self._config(experiment)
        key = experiment.environment_key
        manifest = trial.manifest or {}
        return {
            "code": _code(self.home, experiment.uuid),
            "config": shown,
            "hparams": trial.hparams,
            "seed": None if config is None else trial_seed(experiment, config, trial.number),
            "environment": {"key": key, "packages": self._packages_of(
                key, None if config is None else config.environment.python)},
            "data": {"fingerprint": manifest.get("fingerprint")},
            # the checkpoint its trials start from (`searcher.source_*`), as resolved
            "source": _warm_start(experiment.source),
        }

    def _config(self, experiment: Experiment) -> tuple[ExperimentConfig | None, api.Config]:
        """The experiment's config and its dump; a stored config that no longer validates
        (the schema changed since it was submitted) is shown as stored, its seed unknown:
        a describe answers whatever its experiments hold."""
        known = self._configs.get(experiment.uuid)
        if known is None:
            try:
                config = experiment_config(experiment)
                known = (config, config.model_dump(mode="json"))
            except ValueError as exc:  # pydantic's ValidationError is one
                log.warning("experiment %d: its stored config is no longer valid, so its "
                            "trials' snapshots show it as stored: %s", experiment.id, exc)
                known = (None, dict(experiment.config))
            self._configs[experiment.uuid] = known
        return known

    def _packages_of(self, key: str | None, python: str | None) -> dict[str, str] | None:
        """A built environment's `pip freeze`, or, for a trial on the base interpreter (no
        environment), the packages that interpreter imports (`environment.python`, else
        the server's own): what the trial's `env/` layer inherits."""
        slot = key if key is not None else f"interpreter:{python or sys.executable}"
        if slot not in self._packages:
            self._packages[slot] = (_packages(self.home, key) if key is not None
                                    else _interpreter_packages(python or sys.executable))
        return self._packages[slot]


def diff_experiments(store: Store, home: Home, a: int, b: int) -> api.ExperimentDiff:
    """What differs between experiments `a` and `b`: `diff_trials` of the trials that stand
    for them (`stand_in`), `{a_trial, a_basis, b_trial, b_basis, differences, lines}`.

    Raises:
        NotFound: no such experiment.
        Conflict: one has no trial yet.
    """
    (first, first_basis), (second, second_basis) = _stand_in(store, a), _stand_in(store, b)
    return api.ExperimentDiff(a_trial=first, a_basis=first_basis, b_trial=second,
                              b_basis=second_basis, **diff_trials(store, home, first, second))


def _stand_in(store: Store, experiment_id: int) -> tuple[int, Basis]:
    with store.session_scope() as s:
        exp = experiment_or_404(s, experiment_id)
        searcher = experiment_searcher(exp)
        succeeded = [t.id for t in exp.trials if t.state is TrialState.SUCCEEDED]
        chosen = stand_in(exp.trials, best_validation(s, succeeded,
                                                      views.searcher_goals(searcher)), searcher)
        if chosen is None:
            raise Conflict(f"experiment {experiment_id} has no trial yet, so nothing of it to "
                           "compare (a search draws its first trials on the server's next "
                           f"pass; `muster experiment describe {experiment_id}` lists them)")
        return chosen[0].id, chosen[1]


def stand_in(trials: Sequence[Trial], best: Mapping[int, Mapping[str, float]],
             searcher: SearcherConfig) -> tuple[Trial, Basis] | None:
    """The trial that stands for its experiment in a diff: its best by the searcher's metric
    (`views.best_trial_of`), else its latest (the highest number); None without a trial."""
    winner = views.best_trial_of(trials, best, searcher)
    if winner is not None:
        return winner, Basis.BEST
    if not trials:
        return None
    return max(trials, key=lambda t: (t.number, t.id)), Basis.LATEST
