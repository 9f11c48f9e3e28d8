"""The muster SDK: what the CLI, the web UI's tests and users' scripts call.

```python
from muster.client import Client
c = Client()                       # MUSTER_URL / $MUSTER_HOME/server.json / 127.0.0.1:8080
                                   # token: MUSTER_TOKEN / `muster login` / the home's token
exp = c.create_experiment(Path("exp.yaml").read_text(), Path("."))
for chunk in c.follow_logs(exp["trials"][0]["id"], attempt=1):
    sys.stdout.buffer.write(chunk)
```

Each call returns the shape its route serves, declared once in `muster.api` (stdlib
TypedDicts: `exp` above is an `api.ExperimentDetail`, and a type checker knows its keys).

Plain calls go through `muster.http_transport` (the standard library's `http.client`);
httpx, costly to import, is imported on the first call that streams (`follow_logs`, the
checkpoint downloads), so a CLI command that makes one call starts without it.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, cast
from urllib.parse import quote

from muster import errors
from muster.atomic import read_json
from muster.credentials import Credentials
from muster.home import Home
from muster.http_transport import BrokenOff, File, Response, Transport, TransportError, encode_body
from muster.states import ExperimentState, TrialState

# What only downloads, streams and submissions need is imported by them (httpx,
# checkpoint_archive, git_state, tarfile, rundir): a one-call CLI command starts without it.
if TYPE_CHECKING:
    import tarfile

    import httpx
    from typing_extensions import Unpack

    from muster import api
    from muster.checkpoint_files import Inspection

DEFAULT_URL = "http://127.0.0.1:8080"
API = "/api/v1"
# Never packed, nor is the local run directory (muster.rundir.LOCAL_RUN_DIR: see pack_context).
CONTEXT_EXCLUDES = frozenset({".git", "__pycache__", ".venv", ".mypy_cache"})
MAX_CONTEXT_BYTES = 256 * 1024**2
MAX_CONTEXT_MEMBERS = 10_000  # the server's muster.services.uploads.MAX_MEMBERS
MAX_BATCH = 1000  # configs in one create request: the server's upload_form.MAX_BATCH
MAX_BATCH_CONFIG_BYTES = 16 * 1024**2  # and their bytes: upload_form.MAX_BATCH_CONFIG_BYTES
EXPORT_WAIT = 1800.0  # seconds an export to MLflow may take on the server (files and all)
Shape = TypeVar("Shape")  # a `muster.api` shape, or a list of one
Row = TypeVar("Row")  # a `muster.api` shape, a row of a list

_BY_STATUS: dict[int, type[errors.MusterError]] = {
    400: errors.InvalidRequest,
    401: errors.Unauthorized,
    403: errors.Forbidden,
    404: errors.NotFound,
    409: errors.Conflict,
    410: errors.Gone,
    413: errors.PayloadTooLarge,
    422: errors.ConfigError,
    429: errors.TooManyRequests,
    503: errors.StoreError,
}
# Errors a caller may tell apart from others of their status, by the answer's `error`.
_BY_NAME: dict[tuple[int, object], type[errors.MusterError]] = {
    (429, "QuotaExceeded"): errors.QuotaExceeded,
}


@dataclass(frozen=True)
class LogChunk:
    """One read of a trial's log. Go on from `next_offset` when a rank was named, from
    `next_cursor` when not (a merged read of several ranks has no `next_offset`)."""

    data: bytes
    attempt: int
    next_offset: int | None
    next_cursor: str | None = None


class Paged(list[Row]):
    """A list the server serves a page at a time: these rows, from `offset`, of `total` in
    all (its `X-Total-Count`). A method that returns one reads every page, unless given an
    `offset` or a `limit`: then that page alone."""

    def __init__(self, rows: Iterable[Row], offset: int, total: int) -> None:
        super().__init__(rows)
        self.offset = offset
        self.total = total

    @property
    def next_offset(self) -> int | None:
        """Where the next page starts; None after the last."""
        end = self.offset + len(self)
        return end if self and end < self.total else None


def resolve_url(home: Home, url: str | None = None) -> str:
    """`url`, else `$MUSTER_URL`, else the URL of the server running on `home`, else 8080."""
    if url or os.environ.get("MUSTER_URL"):
        return (url or os.environ["MUSTER_URL"]).rstrip("/")
    running = read_json(home.server_file)
    if isinstance(running, dict) and isinstance(running.get("url"), str):
        return str(running["url"]).rstrip("/")
    return DEFAULT_URL


class Client:
    """Calls the API of one server with one token: `token`, else `$MUSTER_TOKEN`, else the
    token `muster login` kept for the server's URL, else the home's admin token."""

    def __init__(
        self, url: str | None = None, token: str | None = None, home: Home | None = None,
        timeout: float = 30.0, credentials: Credentials | None = None,
    ) -> None:
        self.home = home or Home.resolve()
        self.url = resolve_url(self.home, url)
        self.credentials = credentials or Credentials()
        self._token = token
        self._token_source = "the token given" if token else ""
        self._timeout = timeout
        self._http = Transport(self.url, timeout)
        self._streams: httpx.Client | None = None  # made by the first call that streams
        self._streams_lock = threading.Lock()

    def close(self) -> None:
        self._http.close()
        with self._streams_lock:
            if self._streams is not None:
                self._streams.close()
                self._streams = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -------------------------------------------------------------------------

    def health(self) -> api.Health:
        """Liveness; with a token, also the supervisor's last error's text."""
        return self._call("GET", "/health", _As["api.Health"])

    # -- accounts ------------------------------------------------------------------------

    def whoami(self) -> api.Whoami:
        """The caller: its user, role and how it came (`via`, `token_id`)."""
        return self._call("GET", "/whoami", _As["api.Whoami"])

    def login_token(self, name: str, password: str, token_name: str,
                    expires: str | None = None) -> api.NewToken:
        """Log in with a password and make an API token with the web session that opens
        (then log it out); the token is shown this once."""
        login = encode_body(json={"name": name, "password": password})
        with self._reaching():
            response = self._http.request("POST", API + "/login", body=login)
        if response.status_code >= 400:
            _raise_for(response)
        session = {"X-CSRF-Token": response.json()["csrf_token"], **_cookies_of(response)}
        try:
            return self._call(
                "POST", "/tokens", _As["api.NewToken"], auth=False, headers=session,
                json=_params(name=token_name, expires=expires))
        finally:
            self._request("POST", "/logout", auth=False, headers=session)

    def list_users(self) -> list[api.UserView]:
        return self._call("GET", "/users", _As["list[api.UserView]"])

    def get_user(self, name: str) -> api.UserView:
        return self._call("GET", f"/users/{name}", _As["api.UserView"])

    def create_user(self, name: str, role: str, *, display_name: str = "",
                    password: str | None = None, unix_user: str | None = None
                    ) -> api.NewUser:
        """A new user and their first API token (`token`, shown this once)."""
        body = _params(name=name, role=role, display_name=display_name, password=password,
                       unix_user=unix_user)
        return self._call("POST", "/users", _As["api.NewUser"], json=body)

    def edit_user(self, name: str, **change: str | None) -> api.UserView:
        """Change `display_name`, `role`, `password` (your own: with `current_password`) or
        `unix_user` ("" for the user's name)."""
        return self._call("PATCH", f"/users/{name}", _As["api.UserView"], json=_params(**change))

    def deactivate_user(self, name: str) -> api.UserView:
        return self._call("POST", f"/users/{name}/deactivate", _As["api.UserView"])

    def activate_user(self, name: str) -> api.UserView:
        return self._call("POST", f"/users/{name}/activate", _As["api.UserView"])

    def list_quotas(self) -> list[api.QuotaView]:
        return self._call("GET", "/quotas", _As["list[api.QuotaView]"])

    def user_quotas(self, name: str) -> api.UserQuotas:
        """What `name` is held to: their own quota, then each of their groups'."""
        return self._call("GET", f"/quotas/users/{name}", _As["api.UserQuotas"])

    def set_quota(self, subject: str, name: str | None, limits: Mapping[str, int | None]
                  ) -> api.QuotaView:
        """Set limits (`max_gpus`: 8; None: no limit) of `subject` user, group (with its
        `name`) or default, at runtime (admins)."""
        return self._call("PATCH", _quota_path(subject, name), _As["api.QuotaView"],
                          json=dict(limits))

    def clear_quota(self, subject: str, name: str | None, limits: Sequence[str] = ()
                    ) -> api.QuotaView:
        """Clear runtime limits (`limits`, or all) so that the cluster config's apply."""
        return self._call("DELETE", _quota_path(subject, name), _As["api.QuotaView"],
                          params={"limit": list(limits)} if limits else None)

    def list_groups(self) -> list[api.GroupView]:
        return self._call("GET", "/groups", _As["list[api.GroupView]"])

    def get_group(self, name: str) -> api.GroupView:
        return self._call("GET", f"/groups/{name}", _As["api.GroupView"])

    def create_group(self, name: str, description: str = "") -> api.GroupView:
        return self._call("POST", "/groups", _As["api.GroupView"],
                          json={"name": name, "description": description})

    def delete_group(self, name: str) -> api.GroupView:
        return self._call("DELETE", f"/groups/{name}", _As["api.GroupView"])

    def add_group_members(self, name: str, users: Sequence[str]) -> api.GroupView:
        return self._call("POST", f"/groups/{name}/members", _As["api.GroupView"],
                          json={"users": list(users)})

    def remove_group_member(self, name: str, user: str) -> api.GroupView:
        return self._call("DELETE", f"/groups/{name}/members/{user}", _As["api.GroupView"])

    def create_token(self, name: str = "api token", expires: str | None = None,
                     user: str | None = None) -> api.NewToken:
        """A new API token (an admin: for `user`), shown once."""
        body = _params(name=name, expires=expires, user=user)
        return self._call("POST", "/tokens", _As["api.NewToken"], json=body)

    def list_tokens(self, user: str | None = None) -> list[api.TokenView]:
        return self._call("GET", "/tokens", _As["list[api.TokenView]"], params=_params(user=user))

    def revoke_token(self, token_id: str) -> api.TokenView:
        return self._call("DELETE", f"/tokens/{token_id}", _As["api.TokenView"])

    def add_notification(self, url: str, events: Sequence[str] | None = None
                         ) -> api.NewNotificationSubscription:
        """Be told of your work's `events` (None: all) at `url`; a webhook's signing key is
        in the answer, this once."""
        body: dict[str, Any] = {"url": url}
        if events is not None:
            body["events"] = list(events)
        return self._call("POST", "/notifications", _As["api.NewNotificationSubscription"],
                          json=body)

    def list_notifications(self, everyone: bool = False
                           ) -> list[api.NotificationSubscriptionView]:
        return self._call("GET", "/notifications",
                          _As["list[api.NotificationSubscriptionView]"],
                          params={"all": "true"} if everyone else None)

    def remove_notification(self, subscription_id: int) -> api.NotificationSubscriptionView:
        return self._call("DELETE", f"/notifications/{subscription_id}",
                          _As["api.NotificationSubscriptionView"])

    def notification_log(self, limit: int = 50) -> list[api.NotificationView]:
        """The latest notifications, newest first, with how their delivery went."""
        return self._call("GET", "/notifications/log", _As["list[api.NotificationView]"],
                          params={"limit": limit})

    def list_sessions(self, user: str | None = None) -> list[api.SessionView]:
        """Your open web sessions (an admin: `user`'s)."""
        return self._call("GET", "/sessions", _As["list[api.SessionView]"],
                          params=_params(user=user))

    def end_session(self, session_id: str) -> api.SessionView:
        """End a web session (yours; an admin: anyone's); its cookie stops working."""
        return self._call("DELETE", f"/sessions/{session_id}", _As["api.SessionView"])

    def list_events(self, *, experiment_id: int | None = None, trial_id: int | None = None,
                    user: str | None = None, after_id: int | None = None,
                    limit: int | None = None, tail: int | None = None) -> list[api.AuditEvent]:
        """The audit trail, oldest first."""
        params = _params(experiment_id=experiment_id, trial_id=trial_id, user=user,
                         after_id=after_id, limit=limit, tail=tail)
        return self._call("GET", "/events", _As["list[api.AuditEvent]"], params=params)

    # -- experiments and trials ------------------------------------------------------

    def create_experiment(self, config_text: str, context_dir: Path | None,
                          secrets: Mapping[str, str] | None = None,
                          context_from: int | None = None) -> api.ExperimentDetail:
        """Submit a config, its context directory (packed here, with its git state where it
        lies in a git work tree, `muster.git_state`; or with `context_from`, an earlier
        experiment's snapshot, as "run again", which keeps its own) and the values of its
        `submit` secrets (`environment.secrets`), which the server keeps apart and never
        returns."""
        form = _CreateForm.of(context_dir, secrets, context_from)
        return self._call("POST", "/experiments", _As["api.ExperimentDetail"],
                          **form.request(config_text))

    def create_experiments(self, config_texts: Sequence[str], context_dir: Path | None,
                           secrets: Mapping[str, str] | None = None,
                           context_from: int | None = None) -> list[api.ExperimentDetail]:
        """Submit several configs sharing one context (packed once) as `create_experiment`
        does one, in as few requests as the server's limits allow (MAX_BATCH configs,
        MAX_BATCH_CONFIG_BYTES of them): the server creates each request's experiments in
        one transaction, all or none. Returns the experiments in the order of the
        configs."""
        form = _CreateForm.of(context_dir, secrets, context_from)
        created: list[api.ExperimentDetail] = []
        for batch in _batches(list(config_texts)):
            created += self._create(form, batch)
        return created

    def _create(self, form: _CreateForm, batch: list[str]) -> list[api.ExperimentDetail]:
        """The experiments of one create request: one config is sent, and answered, as one."""
        if len(batch) == 1:
            return [self._call("POST", "/experiments", _As["api.ExperimentDetail"],
                               **form.request(*batch))]
        return self._call("POST", "/experiments", _As["list[api.ExperimentDetail]"],
                          **form.request(*batch))

    # -- drills ---------------------------------------------------------------------------

    def create_drill(self, config_text: str, context_dir: Path | None, *,
                     faults: Sequence[str] = (), scale: float = 0.1, data: str | None = None,
                     at: float = 0.5, context_from: int | None = None) -> api.DrillView:
        """Drill a config (`muster drill`): its context uploaded as a create's (or
        `context_from`'s snapshot); the clean run starts now, each fault's after it."""
        form = _CreateForm.of(context_dir, None, context_from)
        params = _params(faults=list(faults) or None, scale=scale, data=data, at=at)
        return self._call("POST", "/drills", _As["api.DrillView"], params=params,
                          **form.request(config_text))

    def drill_experiment(self, experiment_id: int, *, faults: Sequence[str] = (),
                         scale: float = 0.1, data: str | None = None, at: float = 0.5
                         ) -> api.DrillView:
        """Drill an experiment as it was submitted ("Run a drill")."""
        body = {"faults": list(faults) or None, "scale": scale, "data": data, "at": at}
        return self._call("POST", f"/experiments/{experiment_id}/drills",
                          _As["api.DrillView"], json=body)

    def get_drill(self, drill_id: int) -> api.DrillView:
        return self._call("GET", f"/drills/{drill_id}", _As["api.DrillView"])

    def list_drills(self) -> list[api.DrillSummary]:
        return self._call("GET", "/drills", _As["list[api.DrillSummary]"])

    def cancel_drill(self, drill_id: int) -> api.DrillView:
        return self._call("POST", f"/drills/{drill_id}/cancel", _As["api.DrillView"])

    def cluster_status(self) -> api.ClusterStatus:
        return self._call("GET", "/cluster", _As["api.ClusterStatus"])

    def release_node(self, node_id: str) -> api.NodeReleaseView:
        """Return a quarantined node to the pool (an admin's)."""
        path = f"/cluster/nodes/{quote(node_id, safe='')}/release"
        return self._call("POST", path, _As["api.NodeReleaseView"])

    def list_environments(self, offset: int | None = None, limit: int | None = None
                          ) -> Paged[api.EnvironmentView]:
        """The environments by hash, each with the newest 100 trials that need it or ran in
        it and the count of all (`trials_total`): every one, or (`offset`, `limit`) a page of
        at most 1,000."""
        return self._listed("/environments", _As["list[api.EnvironmentView]"], offset, limit)

    def environment_log(self, prefix: str, offset: int = 0) -> tuple[str, bytes]:
        """(the full hash, up to 1 MiB of its build log from `offset`)."""
        response = self._request("GET", f"/environments/{prefix}/log",
                                 params={"offset": offset})
        return response.headers.get("X-Environment", prefix), response.content

    def prune_environments(self, older_than: str = "7d") -> api.PruneResultView:
        body = {"older_than": older_than}
        return self._call("POST", "/environments/prune", _As["api.PruneResultView"], json=body)

    def list_jobs(self, offset: int | None = None, limit: int | None = None
                  ) -> Paged[api.Job]:
        """Trials that run or wait: those holding resources, then the queue in its order,
        then paused ones, each with why it waits or how far it has come; every one, or
        (`offset`, `limit`) a page of at most 1,000."""
        return self._listed("/jobs", _As["list[api.Job]"], offset, limit)

    def usage(self, by: str = "user", since: str = "30d", user: str | None = None,
              everyone: bool = False) -> api.UsageReport:
        """Slot-hours and GPU-hours of the last `since` (30d, 12h) by user, experiment or
        label, split into productive, lost, stalled, idle and running, with goodput; a
        user's own experiments unless `user` or `everyone` says otherwise."""
        params = _params(by=by, since=since, user=user, everyone="true" if everyone else None)
        return self._call("GET", "/usage", _As["api.UsageReport"], params=params)

    def set_trial_priority(self, trial_id: int, priority: int) -> api.TrialDescription:
        """Give a trial that has not ended a new priority (1-99, lower runs first)."""
        return self._call("POST", f"/trials/{trial_id}/priority", _As["api.TrialDescription"],
                          json={"priority": priority})

    def set_experiment_priority(self, experiment_id: int, priority: int) -> api.ExperimentDetail:
        """Give an experiment's trials that have not ended, and its future ones, a priority."""
        return self._call("POST", f"/experiments/{experiment_id}/priority",
                          _As["api.ExperimentDetail"], json={"priority": priority})

    def list_experiments(self, owner: str | None = None, mine: bool = False, *,
                         state: str | None = None, label: str | None = None,
                         name: str | None = None, sort: str | None = None,
                         descending: bool = False, offset: int | None = None,
                         limit: int | None = None, archived: bool = False
                         ) -> list[api.ExperimentSummary]:
        """Experiments: every one, or `owner`'s, or (`mine`) the caller's; narrowed by
        `state`, `label` and part of the `name`; by `sort` (id, name, state, created, ended,
        priority, owner); a page of `limit` from `offset`."""
        params = _params(owner=owner, mine="true" if mine else None, state=state,
                         label=label, name=name, sort=sort,
                         order="desc" if descending else None, offset=offset, limit=limit,
                         archived="true" if archived else None)
        return self._call("GET", "/experiments", _As["list[api.ExperimentSummary]"], params=params)

    def get_experiment(self, experiment_id: int, offset: int | None = None,
                       limit: int | None = None) -> api.ExperimentDetail:
        """The experiment and a page of its trials: `limit` (the server's default and most:
        1,000) from `offset`; `trials_next_offset` says where the next page starts."""
        return self._call("GET", f"/experiments/{experiment_id}", _As["api.ExperimentDetail"],
                          params=_params(offset=offset, limit=limit))

    def get_experiment_whole(self, experiment_id: int) -> api.ExperimentDetail:
        """`get_experiment` with every trial, a page at a time (a search holds at most
        10,000: ten requests)."""
        exp = self.get_experiment(experiment_id)
        while (at := exp["trials_next_offset"]) is not None:
            page = self.get_experiment(experiment_id, offset=at)  # new trials come last
            exp["trials"].extend(page["trials"])
            exp["trials_next_offset"] = page["trials_next_offset"]
        return exp

    def best_trial(self, experiment_id: int) -> api.TrialDetail:
        """The SUCCEEDED trial with the best value of the searcher's metric so far, as
        `get_trial` gives it plus `best_validation`. NotFound while there is none yet."""
        return self._call("GET", f"/experiments/{experiment_id}/best", _As["api.TrialDetail"])

    def experiment_importance(self, experiment_id: int) -> api.Importance:
        """Each varied hyperparameter's share of the importance for the searcher's metric.
        Conflict while it cannot be told."""
        return self._call("GET", f"/experiments/{experiment_id}/importance", _As["api.Importance"])

    def pareto_front(self, experiment_id: int) -> api.ParetoFront:
        """The experiment's trials by its searcher's objectives, the Pareto front first.
        Raises Conflict when the searcher names no metric."""
        return self._call("GET", f"/experiments/{experiment_id}/front", _As["api.ParetoFront"])

    def list_trials(self, experiment_id: int, sort: str | None = None, *,
                    offset: int | None = None, limit: int | None = None
                    ) -> Paged[api.TrialSummary]:
        """The experiment's trials: by number, or with `sort` by that validation metric (the
        searcher's best first, any other smallest first); every one, or (`offset`, `limit`)
        a page of at most 10,000."""
        return self._listed(f"/experiments/{experiment_id}/trials",
                            _As["list[api.TrialSummary]"], offset, limit, sort=sort)

    def kill_experiment(self, experiment_id: int) -> api.ExperimentDetail:
        return self._call("POST", f"/experiments/{experiment_id}/kill", _As["api.ExperimentDetail"])

    def pause_experiment(self, experiment_id: int) -> api.ExperimentDetail:
        return self._call("POST", f"/experiments/{experiment_id}/pause",
                          _As["api.ExperimentDetail"])

    def activate_experiment(self, experiment_id: int) -> api.ExperimentDetail:
        return self._call("POST", f"/experiments/{experiment_id}/activate",
                          _As["api.ExperimentDetail"])

    def get_trial(self, trial_id: int) -> api.TrialDescription:
        return self._call("GET", f"/trials/{trial_id}", _As["api.TrialDescription"])

    def trial_snapshot(self, trial_id: int) -> api.TrialSnapshot:
        """What the trial was made of (`muster.diagnostics`)."""
        return self._call("GET", f"/trials/{trial_id}/snapshot", _As["api.TrialSnapshot"])

    def diff_trials(self, a: int, b: int) -> api.TrialDiff:
        """What differs in what two trials were made of, most relevant first."""
        return self._call("GET", f"/trials/{a}/diff/{b}", _As["api.TrialDiff"])

    def diff_experiments(self, a: int, b: int) -> api.ExperimentDiff:
        """Two experiments compared through one trial each (its best, else its latest)."""
        return self._call("GET", f"/experiments/{a}/diff/{b}", _As["api.ExperimentDiff"])

    def trial_diagnostics(self, trial_id: int) -> api.TrialDiagnostics:
        """The coded-bias diagnostics of the trial's latest attempt (docs/diagnostics.md)."""
        return self._call("GET", f"/trials/{trial_id}/diagnostics", _As["api.TrialDiagnostics"])

    def read_logs(
        self, trial_id: int, *, attempt: int | None = None, rank: int | None = None,
        offset: int = 0, limit: int | None = None, tail: int | None = None,
        cursor: str | None = None,
    ) -> LogChunk:
        """One slice of an attempt's log (default: the latest attempt).

        With `rank`, that replica's raw bytes from `offset`. Without, an attempt with one
        replica gives the same; one with several gives every rank's whole lines in time
        order, each prefixed `[rank r] `, from `cursor` (the last read's `next_cursor`).
        """
        params = _params(attempt=attempt, rank=rank, offset=offset or None, limit=limit,
                         tail=tail, cursor=cursor)
        response = self._request("GET", f"/trials/{trial_id}/logs", params=params)
        next_offset = response.headers.get("X-Muster-Next-Offset")
        return LogChunk(
            data=response.content,
            attempt=int(response.headers["X-Muster-Attempt"]),
            next_offset=int(next_offset) if next_offset is not None else None,
            next_cursor=response.headers.get("X-Muster-Next-Cursor"),
        )

    def search_logs(
        self, trial_id: int, pattern: str, *, regex: bool = False, ignore_case: bool = False,
        attempt: int | None = None, rank: int | None = None, start: int | None = None,
        backward: bool = False, limit: int | None = None, max_bytes: int | None = None,
    ) -> api.LogSearchResult:
        """One page of a search of one rank's log (default: the latest attempt's first
        rank) for `pattern` (text, or with `regex` an RE2 expression), from byte `start`
        forward (or `backward`). Not `complete`: call again with `start=next_from`.

        Raises:
            ConfigError: a 422: `regex` and the pattern is not valid RE2 syntax (the
                message says where), or a parameter is out of range.
            TooManyRequests: the server is running as many searches as it may at once.
        """
        params = _params(pattern=pattern, regex="true" if regex else None,
                         ignore_case="true" if ignore_case else None, attempt=attempt,
                         rank=rank, limit=limit, max_bytes=max_bytes,
                         direction="backward" if backward else None)
        if start is not None:
            params["from"] = start
        return self._call("GET", f"/trials/{trial_id}/logs/search", _As["api.LogSearchResult"],
                          params=params)

    def follow_logs(
        self, trial_id: int, *, attempt: int | None = None, rank: int | None = None,
        tail: int | None = None, one_attempt: bool = False,
    ) -> Iterator[bytes]:
        """The log's bytes as they are written, until the trial ends (with `one_attempt`,
        until that attempt ends): one rank's, or (no rank) each attempt's as `read_logs`
        gives them, merged lines for several ranks.

        Raises:
            ServerUnavailable: the server could not be reached.
            TooManyRequests: this token already holds as many follows as it may at once.
            ServerError: the server broke the stream off after it had started.
        """
        import httpx

        params = _params(attempt=attempt, rank=rank, tail=tail, follow="true",
                         one_attempt="true" if one_attempt else None)
        headers = self._auth()
        with self._reaching(httpx.TransportError), self._streaming().stream(
            "GET", API + f"/trials/{trial_id}/logs", params=params, headers=headers,
            timeout=httpx.Timeout(30.0, read=None),
        ) as response:
            if response.status_code >= 400:
                response.read()
                self._raise_for(response, headers)
            try:
                yield from response.iter_raw()
            except httpx.TransportError as exc:
                raise errors.ServerError(
                    f"server error: the log stream of trial {trial_id} broke off ({exc}); the "
                    "server may have restarted: follow again, and see its log") from exc

    def get_metrics(
        self, trial_id: int, *, kind: str | None = None, after_step: int | None = None,
        limit: int | None = None, tail: int | None = None,
    ) -> list[api.MetricReport]:
        """One page of the trial's reports `{kind, step, time, attempt, rank, metrics}`.

        NaN and ±Infinity come as the strings "NaN", "Infinity" and "-Infinity". A page never
        ends inside a step; `all_metrics` pages through them all. `tail=N`: the last N.
        """
        params = _params(kind=kind, after_step=after_step, limit=limit, tail=tail)
        return self._call("GET", f"/trials/{trial_id}/metrics", _As["list[api.MetricReport]"],
                          params=params)

    def all_metrics(self, trial_id: int, *, kind: str | None = None) -> list[api.MetricReport]:
        """Every report of the trial, fetched page by page (see `get_metrics`)."""
        reports: list[api.MetricReport] = []
        after_step: int | None = None
        while page := self.get_metrics(trial_id, kind=kind, after_step=after_step):
            reports += page
            after_step = page[-1]["step"]
        return reports

    def list_checkpoints(self, trial_id: int, offset: int | None = None,
                         limit: int | None = None) -> Paged[api.CheckpointView]:
        """The trial's checkpoints by step, each with whether it is intact and why not: every
        one, or (`offset`, `limit`) a page of at most 1,000."""
        return self._listed(f"/trials/{trial_id}/checkpoints", _As["list[api.CheckpointView]"],
                            offset, limit)

    def stream_checkpoint(self, trial_id: int, name: str) -> Generator[bytes, None, None]:
        """An intact checkpoint as a tar (`muster.checkpoint_archive`), as it arrives.

        Raises:
            NotFound: no such trial or checkpoint.
            Conflict: the checkpoint is not intact, or has changed since it was registered.
            ServerError: the download broke off (a file changed while it was sent).
        """
        path = f"/trials/{trial_id}/checkpoints/{quote(name, safe='')}/download"
        yield from self._stream_archive(path, f"checkpoint {name} of trial {trial_id}")

    def _stream_archive(self, path: str, what: str) -> Generator[bytes, None, None]:
        import httpx

        from muster import checkpoint_archive

        headers = self._auth()
        with self._reaching(httpx.TransportError), self._streaming().stream(
            "GET", API + path, headers=headers, timeout=httpx.Timeout(30.0, read=300.0),
        ) as response:
            if response.status_code >= 400:
                response.read()
                self._raise_for(response, headers)
            try:
                yield from response.iter_bytes(checkpoint_archive.CHUNK_BYTES)
            except httpx.TransportError as exc:
                raise errors.ServerError(
                    f"the download of {what} broke off ({exc}); see the server's log for "
                    "why, and download it again") from exc

    def create_model(self, name: str, description: str = "", labels: list[str] | None = None
                     ) -> api.RegisteredModelView:
        """A new, empty model of the registry."""
        body = {"name": name, "description": description, "labels": labels or []}
        return self._call("POST", "/models", _As["api.RegisteredModelView"], json=body)

    def register_model_version(self, name: str, trial_id: int, *,
                               checkpoint: str | None = None, pick: str = "latest",
                               accept_unverified: str | None = None) -> api.ModelVersionView:
        """Trial `trial_id`'s checkpoint as model `name`'s next version."""
        body = _params(trial_id=trial_id, checkpoint=checkpoint, pick=pick,
                       accept_unverified=accept_unverified)
        return self._call("POST", f"/models/{quote(name, safe='')}/versions",
                          _As["api.ModelVersionView"], json=body)

    def list_models(self, offset: int | None = None, limit: int | None = None
                    ) -> Paged[api.RegisteredModelView]:
        """The models by name, each with its newest 100 versions and the count of all
        (`versions_total`): every one, or (`offset`, `limit`) a page of at most 1,000."""
        return self._listed("/models", _As["list[api.RegisteredModelView]"], offset, limit)

    def list_model_versions(self, name: str, offset: int | None = None,
                            limit: int | None = None) -> Paged[api.ModelVersionView]:
        """A model's versions, oldest first: every one, or (`offset`, `limit`) a page of at
        most 1,000."""
        return self._listed(f"/models/{quote(name, safe='')}/versions",
                            _As["list[api.ModelVersionView]"], offset, limit)

    def get_model(self, name: str) -> api.RegisteredModelView:
        """A model with its newest 100 versions, oldest first, and the count of all
        (`versions_total`); `list_model_versions` reads every one."""
        return self._call("GET", f"/models/{quote(name, safe='')}",
                          _As["api.RegisteredModelView"])

    def get_model_version(self, ref: str) -> api.ModelVersionView:
        """The version `ref` names (`NAME`, `NAME@3`, `NAME@production`, `NAME@staging`),
        with its lineage."""
        return self._call("GET", _version_path(ref), _As["api.ModelVersionView"])

    def set_model_stage(self, ref: str, stage: str) -> api.ModelVersionView:
        """Move a version to `stage` (none, staging, production, archived)."""
        return self._call("PUT", _version_path(ref) + "/stage", _As["api.ModelVersionView"],
                          json={"stage": stage})

    def delete_model_version(self, ref: str) -> api.ModelVersionView:
        """Take a version out of the registry (admins); what it was."""
        return self._call("DELETE", _version_path(ref), _As["api.ModelVersionView"])

    def delete_model(self, name: str) -> api.RegisteredModelView:
        """Delete a model that has no versions left (admins)."""
        return self._call("DELETE", f"/models/{quote(name, safe='')}",
                          _As["api.RegisteredModelView"])

    def download_model_version(self, ref: str, dest: Path
                               ) -> tuple[api.ModelVersionView, Inspection]:
        """Unpack the checkpoint of the version `ref` names into `dest` (new, or an empty
        directory), every file checked against its sha256 before `dest` gets its name; the
        version and what is there.

        Raises:
            InvalidRequest: `ref` is not a version's name, or `dest` is in the way.
            NotFound: no such model or version.
            Conflict: its checkpoint is no longer intact on the server.
            ServerError: the download broke off, or what arrived is not intact; nothing of
                it is kept.
        """
        from muster.checkpoint_archive import unpack_checkpoint

        version = self.get_model_version(ref)
        top = f"{version['model']}-v{version['version']}"
        path = _version_path(f"{version['model']}@{version['version']}") + "/download"
        with closing(self._stream_archive(path, top)) as chunks:
            found = unpack_checkpoint(chunks, dest, top, version["trial_id"], gzipped=True)
        return version, found

    def export_model_version(self, ref: str) -> api.MlflowExport:
        """Have the server export the version `ref` names to the MLflow tracking server its
        cluster config names (`muster.mlflow_export`), and wait for it (up to 30 minutes).

        Raises:
            Conflict: the cluster config names no MLflow server.
            ServerError: MLflow did not answer, or refused (a 502 with its words).
        """
        import httpx

        headers = self._auth()
        with self._reaching(httpx.TransportError):
            response = self._streaming().post(
                API + _version_path(ref) + "/mlflow", headers=headers,
                timeout=httpx.Timeout(30.0, read=EXPORT_WAIT))
        if response.status_code >= 400:
            self._raise_for(response, headers)
        return cast("api.MlflowExport", response.json())

    def get_artifacts(self, trial_id: int) -> api.ArtifactSetView:
        """The files the trial's final attempt left that its config names, as the server
        copied them when it ended (each with its size and sha256)."""
        return self._call("GET", f"/trials/{trial_id}/artifacts", _As["api.ArtifactSetView"])

    def download_artifacts(self, trial_id: int, dest: Path) -> api.ArtifactSetView:
        """Every file of the trial's artifact set into `dest` (new, or an empty directory),
        each checked against its sha256 before `dest` is given its name; the set.

        Raises:
            InvalidRequest: `dest` is in the way.
            NotFound: no such trial, or it has no artifacts.
            Conflict: the set has no file to download (still being copied, empty, refused).
            ServerError: a download broke off, or a file's bytes do not match its sha256;
                nothing of it is kept.
        """
        import hashlib
        import shutil

        from muster.checkpoint_archive import check_target, rename_into_place

        found = self.get_artifacts(trial_id)
        if not found["files"]:
            raise errors.Conflict(f"trial {trial_id}'s artifacts are {found['state']}"
                                  + (f" ({found['message']})" if found["message"] else "")
                                  + ": there is no file to download")
        check_target(dest, "")
        dest.parent.mkdir(parents=True, exist_ok=True)
        unpacking = dest.parent / f".{dest.name}.download-{os.urandom(4).hex()}"
        unpacking.mkdir()
        try:
            for item in found["files"]:
                relative = PurePosixPath(item["path"])
                if relative.is_absolute() or ".." in relative.parts:
                    raise errors.ServerError(f"the server named an artifact outside the set: "
                                             f"{item['path']!r}; nothing was kept")
                target = unpacking.joinpath(*relative.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                path = f"/trials/{trial_id}/artifacts/{quote(item['path'])}"
                with open(target, "xb") as out:
                    for chunk in self._stream_archive(path, f"artifact {item['path']!r}"):
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != item["sha256"]:
                    raise errors.ServerError(f"artifact {item['path']!r} of trial {trial_id} "
                                             "arrived with another sha256 than its set "
                                             "records; nothing was kept")
            rename_into_place(unpacking, dest, "the artifacts", "")
        except BaseException:
            shutil.rmtree(unpacking, ignore_errors=True)
            raise
        return found

    def get_checkpoint(self, checkpoint: str) -> api.CheckpointView:
        """One checkpoint by id or uuid (as `list_checkpoints` shows it)."""
        path = f"/checkpoints/{quote(checkpoint, safe='')}"
        return self._call("GET", path, _As["api.CheckpointView"])

    def download_checkpoint_by_ref(self, checkpoint: str, dest: Path
                                   ) -> tuple[api.CheckpointView, Inspection]:
        """Unpack a checkpoint (by id or uuid) into `dest`, from the run directory or from
        storage, every sha256 checked as `download_checkpoint` does; its view and what is
        there."""
        from muster.checkpoint_archive import unpack_checkpoint

        view = self.get_checkpoint(checkpoint)
        path = f"/checkpoints/{quote(checkpoint, safe='')}/download"
        with closing(self._stream_archive(path, f"checkpoint {checkpoint}")) as chunks:
            return view, unpack_checkpoint(chunks, dest, view["name"], view["trial_id"])

    def list_experiment_checkpoints(self, experiment_id: int, offset: int | None = None,
                                    limit: int | None = None) -> Paged[api.CheckpointView]:
        """The checkpoints of the experiment's trials, by trial number and step: every one,
        or (`offset`, `limit`) a page of at most 1,000."""
        return self._listed(f"/experiments/{experiment_id}/checkpoints",
                            _As["list[api.CheckpointView]"], offset, limit)

    def collect_checkpoints(self, experiment_id: int, dry_run: bool,
                            counts: dict[str, int]) -> api.GcPlan:
        return self._call("POST", f"/experiments/{experiment_id}/checkpoints/gc", _As["api.GcPlan"],
                          json={"dry_run": dry_run, **counts})

    def sweep_runs(self, dry_run: bool) -> api.RetentionPlan:
        """What the cluster config's retention removes now, with sizes; unless `dry_run`,
        removed at once by the server's storage worker (admins only)."""
        return self._call("POST", "/retention/runs", _As["api.RetentionPlan"],
                          json={"dry_run": dry_run})

    def delete_experiment(self, experiment_id: int) -> api.DeleteAccepted:
        return self._call("DELETE", f"/experiments/{experiment_id}", _As["api.DeleteAccepted"])

    def archive_experiment(self, experiment_id: int, archived: bool) -> api.Archived:
        verb = "archive" if archived else "unarchive"
        return self._call("POST", f"/experiments/{experiment_id}/{verb}", _As["api.Archived"])

    def download_checkpoint(self, trial_id: int, name: str, dest: Path) -> Inspection:
        """Unpack an intact checkpoint into `dest` (new, or an empty directory), every file
        checked against its sha256 in metadata.json before the directory is given that
        name; what is there (`checkpoint_files.Inspection`).

        Raises:
            InvalidRequest: `dest` is in the way (a file, or a directory with files in it).
            NotFound, Conflict: as `stream_checkpoint`.
            ServerError: the download broke off, or what arrived is not intact; nothing of
                it is kept.
        """
        from muster.checkpoint_archive import unpack_checkpoint

        with closing(self.stream_checkpoint(trial_id, name)) as chunks:
            return unpack_checkpoint(chunks, dest, name, trial_id)

    def dump_trial(self, trial_id: int) -> api.DumpResult:
        """Save an evidence bundle of a RUNNING trial now (what muster saves before it stops
        a stalled replica): `{bundle, attempt, path, ranks: [{rank, complete, line, tool,
        errors}]}`, once every rank's part is in (at most ~20 s).

        Raises:
            Conflict: the trial is not RUNNING, or a dump of it is under way.
        """
        return self._call("POST", f"/trials/{trial_id}/dump", _As["api.DumpResult"])

    def download_evidence(self, trial_id: int, dest: Path, attempt: int | None = None) -> None:
        """Unpack every evidence bundle of one attempt (default: the latest that has any)
        into `dest` (new, or an empty directory): `<bundle>/rank-<r>/...`.

        Raises:
            InvalidRequest: `dest` is in the way (a file, or a directory with files in it).
            NotFound: no such trial or attempt, or it has no evidence.
            ServerError: the download broke off or is malformed; nothing of it is kept.
        """
        from muster.checkpoint_archive import unpack_files

        query = "" if attempt is None else f"?attempt={attempt}"
        what = f"the evidence of trial {trial_id}"
        with closing(self._stream_archive(f"/trials/{trial_id}/evidence{query}", what)
                     ) as chunks:
            unpack_files(chunks, dest, "evidence", what)

    def kill_trial(self, trial_id: int) -> api.TrialDescription:
        """Stop one trial for good (CANCELED); its search goes on."""
        return self._call("POST", f"/trials/{trial_id}/kill", _As["api.TrialDescription"])

    def pause_trial(self, trial_id: int) -> api.TrialDescription:
        """Pause one trial until `activate_trial`; its experiment stays ACTIVE."""
        return self._call("POST", f"/trials/{trial_id}/pause", _As["api.TrialDescription"])

    def activate_trial(self, trial_id: int) -> api.TrialDescription:
        """Queue a PAUSED trial again (it resumes from its latest checkpoint)."""
        return self._call("POST", f"/trials/{trial_id}/activate", _As["api.TrialDescription"])

    def restart_trial(self, trial_id: int) -> api.TrialDescription:
        """Stop a running trial and queue it again at once, from its latest checkpoint."""
        return self._call("POST", f"/trials/{trial_id}/restart", _As["api.TrialDescription"])

    def review_trial(self, trial_id: int, decision: str, note: str) -> api.TrialDescription:
        """Approve ("approve" → SUCCEEDED) or reject ("reject" → FAILED) a SUSPECT trial; the
        review is recorded as the token's user's."""
        body = {"decision": decision, "note": note}
        return self._call("POST", f"/trials/{trial_id}/review", _As["api.TrialDescription"],
                          json=body)

    def wait_experiment(self, experiment_id: int, poll: float = 0.5) -> api.ExperimentDetail:
        """Block until the experiment has ended, or every trial is at rest (ended, or SUSPECT
        and waiting for a review, which keeps the experiment ACTIVE); return it."""
        while not at_rest(exp := self.get_experiment(experiment_id)):
            time.sleep(poll)
        return exp

    # -- plumbing ----------------------------------------------------------------------

    def _auth(self) -> dict[str, str]:
        """The bearer header; empty when there is no token to send (see `_raise_for`)."""
        if self._token is None:
            self._token, self._token_source = self._find_token()
            if self._token is None:
                # Ask anyway: with no server there, "cannot reach" is the message that helps.
                return {}
        return {"Authorization": f"Bearer {self._token}"}

    def _find_token(self) -> tuple[str | None, str]:
        """(the token to send, where it came from)."""
        if os.environ.get("MUSTER_TOKEN"):
            return os.environ["MUSTER_TOKEN"].strip(), "$MUSTER_TOKEN"
        try:
            kept = self.credentials.token_for(self.url)
        except ValueError as exc:
            raise errors.InvalidRequest(str(exc)) from exc
        if kept is not None:
            return kept, f"the token `muster login` kept in {self.credentials.path}"
        try:
            return (self.home.token_path.read_text().strip(),
                    f"the server's admin token in {self.home.token_path}")
        except (FileNotFoundError, PermissionError):
            return None, ""

    def _streaming(self) -> httpx.Client:
        """The httpx client of the calls that stream, made on the first (importing httpx
        costs a third of a one-call CLI command's start-up). It verifies https with the
        plain calls' TLS context."""
        import httpx

        with self._streams_lock:
            if self._streams is None:
                self._streams = httpx.Client(base_url=self.url, timeout=self._timeout,
                                             verify=self._http.tls_context or False)
            return self._streams

    @contextmanager
    def _reaching(self, *also: type[Exception]) -> Iterator[None]:
        """Turn a request that got no answer into ServerUnavailable; `also`: the streaming
        client's errors of that kind."""
        unanswered: tuple[type[Exception], ...] = (TransportError, *also)
        try:
            yield
        except BrokenOff as exc:
            raise errors.ServerUnavailable(f"muster server at {self.url}: {exc}") from exc
        except unanswered as exc:
            raise errors.ServerUnavailable(
                f"cannot reach the muster server at {self.url} ({exc}); start it with "
                "`muster up --detach` or set MUSTER_URL"
            ) from exc

    def _request(self, method: str, path: str, auth: bool = True, *,
                 params: Mapping[str, object] | None = None,
                 headers: Mapping[str, str] | None = None, json: Any = None,
                 data: Mapping[str, object] | None = None,
                 files: Mapping[str, File] | None = None) -> Response:
        sent = {**(self._auth() if auth else {}), **(headers or {})}
        body = encode_body(json, data, files)
        with self._reaching():
            response = self._http.request(method, API + path, params=params, headers=sent,
                                          body=body)
        if response.status_code >= 400:
            self._raise_for(response, sent)
        return response

    def _raise_for(self, response: _Answer, headers: Mapping[str, str]) -> None:
        if response.status_code == 401 and "Authorization" not in headers:
            raise errors.Unauthorized(
                f"no API token to send to {self.url}: set MUSTER_TOKEN, run `muster login "
                f"{self.url}`, or on the server's machine use its home (the server writes "
                f"its admin token to {self.home.token_path} on first start)")
        if response.status_code == 401:
            _raise_for(response, f" (sent {self._token_source})")
        _raise_for(response)

    def _call(self, method: str, path: str, shape: type[_As[Shape]], auth: bool = True,
              **request: Unpack[_Sent]) -> Shape:
        """The answer's JSON as the `muster.api` shape its route serves (`shape`). Read as
        that, not checked again: the server's response model checked it on the way out."""
        return cast(Shape, self._request(method, path, auth=auth, **request).json())

    def _listed(self, path: str, shape: type[_As[list[Row]]], offset: int | None,
                limit: int | None, **params: object) -> Paged[Row]:
        """A list the server pages (`shape`, as `_call` takes it): the page of `limit` from
        `offset` where either is given, else every row, a page at a time until
        `X-Total-Count`."""
        if offset is not None or limit is not None:
            return self._page(path, offset or 0, limit, params)
        page = self._page(path, 0, None, params)
        rows = list(page)
        while (at := page.next_offset) is not None:
            page = self._page(path, at, None, params)
            rows += page
        return Paged(rows, 0, len(rows))

    def _page(self, path: str, offset: int, limit: int | None,
              params: Mapping[str, object]) -> Paged[Any]:
        response = self._request("GET", path, params=_params(**params, offset=offset or None,
                                                             limit=limit))
        rows = response.json()
        total = response.headers.get("X-Total-Count")  # (a server before paging sends none)
        return Paged(rows, offset, int(total) if total is not None else offset + len(rows))


class _As(Generic[Shape]):
    """`_As["api.TrialDescription"]`: what `Client._call` reads an answer as. The shape is
    named in a string, for the type checker only: nothing reads it at run time, and
    importing `muster.api` (some 70 TypedDicts) would add ~3.5 ms to the start-up of every
    CLI command that calls the server."""


def at_rest(exp: api.ExperimentDetail) -> bool:
    """Ended, or held open only by SUSPECT trials waiting for a review. (When every trial
    has ended, the experiment's own end follows within a supervisor pass: wait for it.)"""
    if ExperimentState(exp["state"]).is_terminal():
        return True
    states = [TrialState(state) for state in exp["trial_states"]]  # all, not one page's
    return (all(state.is_at_rest() for state in states)
            and any(state is TrialState.SUSPECT for state in states))


def _version_path(ref: str) -> str:
    """`/models/NAME/versions/AT` for `NAME@AT` (`NAME` alone: the latest version)."""
    name, _, at = ref.partition("@")
    if not name:
        raise errors.InvalidRequest(f"{ref!r} does not name a model version: write NAME, "
                                    "NAME@3, NAME@production or NAME@staging")
    return f"/models/{quote(name, safe='')}/versions/{quote(at or 'latest', safe='')}"


def _quota_path(subject: str, name: str | None) -> str:
    """`/quotas/default`, `/quotas/users/NAME` or `/quotas/groups/NAME`."""
    return "/quotas/default" if subject == "default" else f"/quotas/{subject}s/{name}"


def _params(**values: Any) -> dict[str, Any]:
    """A query or a body of the values given, without those left out (None)."""
    return {k: v for k, v in values.items() if v is not None}


def _cookies_of(response: Response) -> dict[str, str]:
    """A `Cookie` header that sends back the cookies the answer set (a login's session)."""
    pairs = [cookie.split(";", 1)[0].strip()
             for cookie in response.headers.get_all("Set-Cookie") or []]
    return {"Cookie": "; ".join(pairs)} if pairs else {}


class _Answer(Protocol):
    """What `_raise_for` reads of an answer: a plain call's, or a stream's (httpx's)."""

    @property
    def status_code(self) -> int: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


def _raise_for(response: _Answer, suffix: str = "") -> None:
    kind = None
    try:
        body = response.json()
        message = str(body["message"]) + suffix
        kind = _BY_NAME.get((response.status_code, body.get("error")))
    except (ValueError, KeyError, TypeError, AttributeError):
        message = (response.text[:500] or response.reason_phrase) + suffix
    if response.status_code >= 500:
        message = f"server error ({response.status_code}): {message}"
    raise (kind or _BY_STATUS.get(response.status_code, errors.ServerError
                                  if response.status_code >= 500 else errors.MusterError)
           )(message)


@dataclass(frozen=True)
class _CreateForm:
    """What every create request of a submission sends besides its configs."""

    data: dict[str, str]
    files: dict[str, File] | None

    @staticmethod
    def of(context_dir: Path | None, secrets: Mapping[str, str] | None,
           context_from: int | None) -> _CreateForm:
        from muster import git_state

        files: dict[str, File] = {}
        data: dict[str, str] = {}
        if context_dir is not None:
            files["context"] = ("context.tar.gz", pack_context(context_dir), "application/gzip")
            git = git_state.capture(context_dir)
            if git is not None:
                data["git"] = git.field()
        if context_from is not None:
            data["context_from"] = str(context_from)
        if secrets:
            data["secrets"] = json.dumps(dict(secrets))
        return _CreateForm(data, files or None)

    def request(self, *config_texts: str) -> _FormFields:
        """The `data`, `files` and headers of a request creating one experiment per config:
        a fresh `Idempotency-Key` each, so the request, sent again, creates nothing more."""
        configs: str | list[str] = (config_texts[0] if len(config_texts) == 1
                                    else list(config_texts))
        return {"data": {"config": configs, **self.data}, "files": self.files,
                "headers": {"Idempotency-Key": os.urandom(16).hex()}}


class _Sent(TypedDict, total=False):
    """What a request sends besides its method and path (`Client._request`'s keywords)."""

    params: Mapping[str, object] | None
    headers: Mapping[str, str] | None
    json: Any
    data: Mapping[str, object] | None
    files: Mapping[str, File] | None


class _FormFields(TypedDict):
    """The form of a create request."""

    data: dict[str, str | list[str]]
    files: dict[str, File] | None
    headers: dict[str, str]


def _batches(texts: list[str]) -> Iterator[list[str]]:
    """The configs in runs that each fit one request."""
    batch: list[str] = []
    size = 0
    for text in texts:
        length = len(text.encode())
        if batch and (len(batch) == MAX_BATCH or size + length > MAX_BATCH_CONFIG_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += length
    if batch:
        yield batch


def pack_context(directory: Path, max_bytes: int = MAX_CONTEXT_BYTES) -> bytes:
    """The directory as an in-memory tar.gz, without VCS and cache folders."""
    if not directory.is_dir():
        raise errors.InvalidRequest(f"context directory {directory} does not exist")
    import tarfile

    from muster.rundir import LOCAL_RUN_DIR

    buffer = io.BytesIO()
    members = _Members(directory, CONTEXT_EXCLUDES | {LOCAL_RUN_DIR})
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        tar.add(directory, arcname=".", filter=members.admit)
    if buffer.tell() > max_bytes:
        raise errors.InvalidRequest(
            f"context directory {directory} packs to {buffer.tell() // 1024**2} MiB, over the "
            f"{max_bytes // 1024**2} MiB limit; move data sets out of it"
        )
    return buffer.getvalue()


@dataclass
class _Members:
    """What goes into the archive, checked as it is packed against what the server takes
    (`muster.services.uploads`), so a context it would refuse is not uploaded first."""

    directory: Path
    excluded: frozenset[str]
    count: int = 0

    def admit(self, info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if any(p in self.excluded for p in parts):
            return None
        self.count += 1
        if self.count > MAX_CONTEXT_MEMBERS:
            raise errors.InvalidRequest(
                f"context directory {self.directory} holds more than {MAX_CONTEXT_MEMBERS:,} "
                "files, directories and links; keep data sets and environments out of it")
        if info.issym() and (self.directory / info.name).is_dir():
            raise errors.InvalidRequest(
                f"context directory {self.directory}: {info.name.removeprefix('./')!r} is a "
                f"link to a directory, and the server copies files, not links; copy the "
                "directory in, or read it by its path (e.g. data.path)")
        return info
