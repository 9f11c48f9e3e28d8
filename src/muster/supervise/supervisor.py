"""The supervisor: starts queued trials, follows their attempts, applies the failure policy.

A facade over one module per concept:

- `following`: what happened to a live attempt's replicas since the last pass;
- `ending` and `outcome`: how an attempt ended and the trial's next move (pure ladder);
- `restart_in_place`, `standby`: one replica launched again in its attempt; the next
  attempt started ahead;
- `admission` and `launching`: who starts now (`muster.schedule.plan`), and starting them
  (a pure launch plan, then the launcher);
- `searching`: each search's next trials and its pruner; `experiments`: closing them.

Each `tick()` is one pass over the store; the server's orchestrator calls it in a loop and
tests call it directly. Every state change goes through `muster.store.transition`; every
process action goes through the `Launcher`. The order of a pass is chosen for crash
safety: a decision is committed before the side effect it leads to, so a server killed
between the two finds the decision on restart and carries it out (see `reconcile`). A pass
reads every live attempt once, in one transaction, and hands it down.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.checkpoint_storage.resume import fetch_resume_point
from muster.config.cluster import DEFAULT_LOG_LIMIT
from muster.config.quotas import QuotasConfig
from muster.environments.registry import Environments
from muster.errors import ConfigError, LaunchError
from muster.home import Home
from muster.launch.accounts import RunAs
from muster.launch.base import Launcher
from muster.schedule.placement import Placement
from muster.states import AttemptState, values
from muster.store import Attempt, Store, Trial
from muster.supervise.admission import Admission
from muster.supervise.context import LiveAttempt, SupervisorContext, read_live_attempts
from muster.supervise.ending import Ending
from muster.supervise.experiments import Closing
from muster.supervise.following import Following
from muster.supervise.isolation import Isolation
from muster.supervise.launching import GpuPlan, Launching, Recorded, Scan
from muster.supervise.placement import Placements
from muster.supervise.restart_in_place import RestartInPlace
from muster.supervise.searching import Searching
from muster.supervise.standby import Standby
from muster.system_metrics import DEFAULT_INTERVAL_S

__all__ = ["ADMITTED_AT_SUBMISSION", "AdmitNew", "Supervisor"]

log = logging.getLogger(__name__)

# Records, in the caller's transaction, the first attempt of a trial created in it when it
# may start at once (`Supervisor.admitting_new`).
AdmitNew = Callable[[Session, Trial], None]
# How long a create waits for the pass's admission to finish before it leaves its trials
# to the pass (the admission's lock is held while a pass decides and records).
ADMIT_WAIT_S = 0.05
# How the event of a trial started that way ends (`muster trial describe` shows it).
ADMITTED_AT_SUBMISSION = "admitted at its submission: a slot was free and nothing waited"


@dataclass
class Supervisor:
    store: Store
    launcher: Launcher
    home: Home
    # Where replicas go: the slots, the GPUs and the nodes (`muster.schedule.placement`).
    placement: Placement
    host: str = socket.gethostname()
    min_free_disk: int = 5 * 1024**3
    preemption: bool = False
    run_as: RunAs | None = None  # whom jobs run as (cluster config `run_as`)
    quarantine_after: int = 3  # cluster config `node_quarantine.failures`
    # Cluster config `base_environment`: trials without an environment block run on it
    # (None: on the runtime base computed from muster's own installation).
    base_environment: str | None = None
    # Cluster config `log_limit`: what a replica's log keeps when its experiment does not
    # say (None: no limit).
    log_limit: int | None = DEFAULT_LOG_LIMIT
    # Cluster config `system_metrics_interval`: how often each replica's resources are
    # sampled (`muster.launch.resources`).
    system_metrics_interval: float = DEFAULT_INTERVAL_S
    # Cluster config `quotas`: what admission and the searcher's draws hold each user to
    # (with the limits admins set at runtime, read from the store at each pass).
    quotas: QuotasConfig = field(default_factory=QuotasConfig)
    # The home's environments, where the server's platform made them (None: made here, of
    # `run_as` and `base_environment`); `envs` from then on.
    environments: InitVar[Environments | None] = None
    _search: Searching = field(init=False)
    _launching: Launching = field(init=False)
    _standby: Standby = field(init=False)
    _following: Following = field(init=False)
    _admission: Admission = field(init=False)
    _closing: Closing = field(init=False)
    _placements: Placements = field(init=False)
    _isolation: Isolation = field(init=False)
    envs: Environments = field(init=False)
    _followed_dirs: dict[int, Path] = field(default_factory=dict, init=False)
    # Admission's decisions, the pass's and a create's (`admitting_new`), one at a time.
    _admitting: threading.Lock = field(default_factory=threading.Lock, init=False)
    # Attempts a create recorded and committed, for the next pass to launch first; their
    # ids from before the commit, so that no pass reconciles them before they are launched.
    _pending: deque[Recorded] = field(default_factory=deque, init=False)
    _unlaunched: set[int] = field(default_factory=set, init=False)

    def __post_init__(self, environments: Environments | None) -> None:
        self.envs = environments if environments is not None else Environments(
            self.home.envs_dir, shared=self.run_as is not None,
            base_environment=self.base_environment)
        ctx = SupervisorContext(self.store, self.launcher, self.home, self.host,
                                self.placement, self.envs, self.run_as, self.quarantine_after,
                                log_limit=self.log_limit,
                                system_metrics_interval=self.system_metrics_interval)
        self._placements = Placements(ctx)
        ending = Ending(ctx)
        self._isolation = Isolation(ctx)
        self._search = Searching(self.store, self._isolation, self.quotas)
        self._launching = Launching(ctx, ending)
        self._standby = Standby(ctx, self._launching)
        restart = RestartInPlace(ctx, self._launching, ending)
        self._following = Following(ctx, self._search, ending, self._standby, restart)
        self._admission = Admission(ctx, self.start_attempt, self._isolation, self.quotas)
        self._closing = Closing(self.store, self._isolation)

    def tick(self) -> None:
        """One pass: reconcile live attempts, start what may start, close finished experiments.

        Each trial's and each experiment's step is isolated (`isolation`): one that fails
        unexpectedly ends that trial or experiment, and the pass goes on."""
        self._launch_pending()
        self._placements.sweep()
        broken: list[tuple[int, Exception]] = []
        with self.store.session_scope() as s:
            live = read_live_attempts(s, on_broken=lambda *found: broken.append(found))
        for trial_id, exc in broken:
            self._isolation.trial_failed(trial_id, "reading its running attempt", exc)
        self._reconcile(live)
        self._standby.drop_unneeded(live)
        self.envs.reap()
        self.placement.pool.reclaim()  # GPUs of ended trials go back once their memory is free
        self._search.top_up()  # each search's next trials, drawn before admission
        if not self._admission.disk_low(self.min_free_disk):  # nothing launches while low
            with self._admitting:
                self._admission.admit(self.placement.slots(), self.preemption)
        self._launching.drop_stale_scans()
        self._closing.close()

    def active_attempt_ids(self) -> list[int]:
        """The live attempts the passes follow (warm standbys wait unfollowed)."""
        with self.store.session_scope() as s:
            return list(s.scalars(select(Attempt.id).where(
                Attempt.state.in_(values(AttemptState.live())), Attempt.standby.is_(False))
                .order_by(Attempt.id)))

    def reconcile_attempt(self, attempt_id: int) -> None:
        """Look at one live attempt's replicas and record whatever has happened to them."""
        with self.store.session_scope() as s:
            live = read_live_attempts(s, [attempt_id])
        for attempt in live:
            self._following.reconcile(attempt)

    def start_attempt(self, trial_id: int, gpus: GpuPlan = ()) -> None:
        """Start the trial's next attempt: its data scanned first (once), its warm standby
        promoted if one waits, else a new attempt launched."""
        with self._isolation.trial(trial_id, "starting its next attempt"):
            first = self._launching.prelaunch(trial_id)
            if first.scan and self._launching.scan_data(trial_id) is not Scan.READY:
                return
            if first.checkpoints:  # before any transaction: one only storage holds is fetched
                fetch_resume_point(self.store, self.home, trial_id)
            if first.standby and self._standby.promote(trial_id):
                return
            if not self._placements.reserve(trial_id):  # no room for its replicas yet
                return
            self._launching.start(trial_id, gpus)

    @contextmanager
    def admitting_new(self, priority: int) -> Iterator[AdmitNew | None]:
        """Admission for the trials a create records, in its own transaction (issue 19: one
        transaction for the create and the admission, and the launch at the very start of
        the next pass instead of after its reads). Yields None (the trials wait for the pass,
        as before) where the placement reserves, when trials of `priority` (the best of the
        trials to be created) or better wait in the queue already, or when the pass admits
        for longer than `ADMIT_WAIT_S`; else a function to call with each new trial inside
        the create's transaction, before its commit: a trial `Admission.may_start_new`
        lets start gets its first attempt recorded there. Once the `with` block ends
        without an exception (the transaction committed), those attempts are handed to the
        next pass to launch; the caller wakes it.

        A server killed between the commit and the launch leaves an attempt recorded and
        never launched, as one killed between a pass's record and its launch does: the
        reconciliation finds no process and the failure policy restarts it."""
        if (self.placement.reserves or self._admission.queue_waits(priority)
                or not self._admitting.acquire(timeout=ADMIT_WAIT_S)):
            yield None
            return
        recorded: list[Recorded] = []
        try:
            yield lambda s, trial: self._admit_new(s, trial, recorded)
            self._pending.extend(recorded)
        except BaseException:
            self._unlaunched.difference_update(r.attempt_id for r in recorded)
            raise
        finally:
            self._admitting.release()

    def _admit_new(self, s: Session, trial: Trial, recorded: list[Recorded]) -> None:
        if not self._admission.may_start_new(s, trial, self.placement.slots()):
            return
        try:
            attempt = self._launching.record(s, trial, ADMITTED_AT_SUBMISSION)
        except (ConfigError, LaunchError) as exc:  # nothing written: the pass tries again
            log.info("trial %d waits for the pass: %s", trial.id, exc)
            return
        self._unlaunched.add(attempt.attempt_id)
        recorded.append(attempt)

    def _launch_pending(self) -> None:
        """Launch the attempts creates recorded (`admitting_new`)."""
        while self._pending:
            recorded = self._pending.popleft()
            with self._isolation.trial(recorded.trial_id, "launching its first attempt"):
                try:
                    self._launching.launch(recorded)
                finally:
                    self._unlaunched.discard(recorded.attempt_id)

    def slots_in_use(self) -> int:
        """One slot per replica without GPUs of every trial that holds its resources."""
        return self._admission.slots_in_use()

    def followed_dirs(self) -> dict[int, Path]:
        """The directories of the attempts the last pass followed, by attempt id."""
        return dict(self._followed_dirs)

    def child_pids(self) -> list[int]:
        """The processes whose end a pass reads: environment builds and data scans."""
        return self.envs.pids() + self._launching.scans.pids()

    def waits_on_the_clock(self) -> bool:
        """Whether the last pass left something that only a later look can resolve: GPUs
        whose memory is still being released (no event says when it is)."""
        return self.placement.pool.releasing > 0

    def _reconcile(self, live: list[LiveAttempt]) -> None:
        followed = [attempt for attempt in live
                    if not attempt.standby and attempt.id not in self._unlaunched]
        self._followed_dirs = {attempt.id: attempt.dir.path for attempt in followed}
        for attempt in followed:
            with self._isolation.trial(attempt.trial.id, f"following attempt {attempt.number}"):
                self._following.reconcile(attempt)
        self._following.forget_all_but(followed)
