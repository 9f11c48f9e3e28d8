"""Environments as the API shows them: `muster env list`, `env logs`, `env prune`.

A build log holds what uv and the setup commands printed, which may be a user's own
secrets (an index's credentials, a setup command's output). So it is read by admins and by
the environment's owners (the owners of experiments that need it or whose trials ran in
it) alone, unless the cluster config opens it to every reader (`build_logs: everyone`);
the list shows others an environment's state, not why its build failed.
"""

from __future__ import annotations

from sqlalchemy import func, select, union

from muster import api
from muster.environments.registry import Environments, EnvSummary
from muster.errors import Forbidden, InvalidRequest
from muster.launch.logs import MAX_OFFSET
from muster.services.access import Principal
from muster.services.listing import MAX_NESTED, Page, check_window, newest_place
from muster.states import ExperimentState, TrialState, values
from muster.store import Experiment, Store, Trial

__all__ = ["LOG_CHUNK_BYTES", "MAX_PAGE", "environment_log", "list_environments",
           "prune_environments"]

LOG_CHUNK_BYTES = 1 << 20
MAX_PAGE = 1000  # environments in one page of the list: the default and the most


def list_environments(store: Store, envs: Environments, who: Principal,
                      logs_open: bool = False, offset: int = 0, limit: int = MAX_PAGE
                      ) -> Page[api.EnvironmentView]:
    """A page of the environments by hash, `limit` (at most `MAX_PAGE`, the default) from
    `offset`, with the newest `MAX_NESTED` trials that use each (those of experiments that
    need it and those that ran in it) and the count of all; why a build failed only where
    `who` may read its log. (An environment is a directory, not a row: the page is of their
    sorted names, and only its own are read.)

    Raises:
        InvalidRequest: a negative `offset`, or a `limit` not 1 to `MAX_PAGE`.
    """
    check_window(offset, limit, MAX_PAGE)
    every = envs.layout.hashes()
    keys = every[offset:offset + limit]
    trials, totals = _trials_by_key(store, keys)
    readable = None if logs_open or who.is_admin else _owned_keys(store, who)
    rows = [_environment_view(envs.summary(key), trials.get(key, []), totals.get(key, 0),
                              why_failed=readable is None or key in readable) for key in keys]
    return Page(rows, len(every), offset, limit)


def _environment_view(summary: EnvSummary, trials: list[int], trials_total: int, *,
                      why_failed: bool) -> api.EnvironmentView:
    return {"hash": summary.hash, "python": summary.python, "inherit": summary.inherit,
            "packages": list(summary.packages), "setup": [list(s) for s in summary.setup],
            "state": summary.state, "size_bytes": summary.size_bytes,
            "built_at": summary.built_at, "last_used": summary.last_used,
            "message": summary.message if why_failed else None, "trials": trials,
            "trials_total": trials_total}


def environment_log(store: Store, envs: Environments, prefix: str, who: Principal,
                    offset: int = 0, logs_open: bool = False) -> tuple[str, bytes]:
    """(hash, up to 1 MiB of its build log from `offset`).

    Raises:
        Forbidden: `who` is neither an admin nor one of the environment's owners, and
            the logs are not open to every reader (`logs_open`).
    """
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidRequest(f"offset must be 0 to {MAX_OFFSET}")
    key = envs.resolve(prefix)
    if not (logs_open or who.is_admin or key in _owned_keys(store, who)):
        raise Forbidden(f"the build log of environment {key} is read by the owners of the "
                        "experiments that need it and by admins (the cluster config's "
                        "build_logs: owners); ask one of them, or an admin to set "
                        "build_logs: everyone")
    try:
        with envs.log_path(key).open("rb") as f:
            f.seek(offset)
            return key, f.read(LOG_CHUNK_BYTES)
    except FileNotFoundError:
        return key, b""


def prune_environments(store: Store, envs: Environments, older_than_s: float
                       ) -> api.PruneResultView:
    """Remove what no trial that has not ended needs, unused for `older_than_s`."""
    with store.session_scope() as s:
        live = values([t for t in TrialState if not t.is_terminal()])
        rows = s.execute(select(Trial.environment_key, Experiment.environment_key)
                         .join(Experiment, Trial.experiment_id == Experiment.id)
                         .where(Trial.state.in_(live))).all()
        waiting = s.scalars(select(Experiment.environment_key).where(
            Experiment.environment_key.is_not(None),
            Experiment.state.in_(values([e for e in ExperimentState
                                         if not e.is_terminal()])))).all()
    in_use: set[str] = {k for row in rows for k in row if k} | {k for k in waiting if k}
    pruned = envs.prune(older_than_s, in_use)
    return {"removed": list(pruned.removed), "kept_in_use": list(pruned.kept_in_use),
            "freed_bytes": pruned.freed_bytes}


def _owned_keys(store: Store, who: Principal) -> set[str]:
    """The environments `who`'s experiments need, or that their trials ran in."""
    with store.session_scope() as s:
        rows = s.execute(select(Experiment.environment_key, Trial.environment_key)
                         .outerjoin(Trial, Trial.experiment_id == Experiment.id)
                         .where(Experiment.owner_id == who.user_id)).all()
    return {key for row in rows for key in row if key}


def _trials_by_key(store: Store, keys: list[str]
                   ) -> tuple[dict[str, list[int]], dict[str, int]]:
    """The newest `MAX_NESTED` trials that use each of `keys`, ascending, and how many do,
    by key: counted and picked in the database, never read whole."""
    if not keys:
        return {}, {}
    # (key, trial) once each: a trial that ran in the environment its experiment needs
    # is one use.
    uses = union(
        select(Trial.environment_key.label("key"), Trial.id.label("trial_id"))
        .where(Trial.environment_key.in_(keys)),
        select(Experiment.environment_key, Trial.id)
        .join(Trial, Trial.experiment_id == Experiment.id)
        .where(Experiment.environment_key.in_(keys))).subquery()
    ranked = select(uses.c.key, uses.c.trial_id, newest_place(uses.c.key, uses.c.trial_id)
                    ).subquery()
    newest: dict[str, list[int]] = {}
    with store.session_scope() as s:
        totals = {key: n for key, n in s.execute(
            select(uses.c.key, func.count()).group_by(uses.c.key))}
        for key, trial_id in s.execute(select(ranked.c.key, ranked.c.trial_id)
                                       .where(ranked.c.place <= MAX_NESTED)
                                       .order_by(ranked.c.key, ranked.c.trial_id)):
            newest.setdefault(key, []).append(trial_id)
    return newest, totals
