"""The server's drill thread: each drill's runs, one after another, step by step.

Every step is read from the store and recorded before it acts ("committed before the
action it leads to"), so a server killed mid-drill, by the server-restart fault itself or
otherwise, goes on where it was: a fault recorded INJECTED is never injected twice, a run
whose experiment was made (`experiments.drill_id`, `drill_fault`, in the create's own
transaction) is never made twice. A run goes:

  PENDING   → its experiment made (from the clean run's snapshot; corrupt-data damages
              the copy of the data before it is recorded)               → RUNNING
  RUNNING   → its trial RUNNING and the fault due (a fraction `at` of the planned length,
              or of the clean run's time): recorded, then injected       → INJECTED
  INJECTED  → its trial ended (or the deadline passed: the drill kills it), judged
              (`muster.drill.judge`), what the fault left cleaned up     → ENDED

The clean run goes first; a drill whose clean run did not succeed skips its faults (a
fault's run means nothing beside a clean run that fails).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from muster import api
from muster.drill import inject, link
from muster.drill.judge import CleanRun, clean_run, judge
from muster.drill.plan import DrillOptions, DrillPlan, plan_drill
from muster.drill.restarter import restart_server
from muster.errors import Conflict, InjectionError, MusterError
from muster.home import Home
from muster.launch.base import ProcessIdentity
from muster.launch.identity import is_alive
from muster.services import experiments
from muster.services.access import Principal
from muster.services.drills import DrillServer, data_path, finish_drill, network_drill
from muster.services.experiments import DrillMark, NewExperiments
from muster.states import DrillFault, DrillRunState, DrillState, TrialState
from muster.store import Store
from muster.store.models import Drill, DrillRun, Experiment, User
from muster.words import span

__all__ = ["DrillRunner"]

log = logging.getLogger(__name__)

TICK_S = 0.25
MAX_BACKOFF_S = 30.0
MIN_DEADLINE_S = 60.0  # a fault's run is given at least this long after the fault
MAX_TIMEOUT_WAIT_S = 600.0  # of a hang's timeout, at most this is waited for
FS_MARGIN = 16 << 20  # a disk-full run's file system: the clean run's size, and this
MAX_FS_BYTES = 1 << 30


@dataclass(frozen=True)
class Step:
    """One run of a drill as read from the store, to act on outside the transaction."""

    drill_id: int
    run_id: int
    fault: DrillFault | None  # None: the clean run
    state: DrillRunState
    experiment_id: int | None
    started_at: float | None
    injected_at: float | None
    outcome: dict[str, Any] | None
    owner: Principal
    options: DrillOptions
    config_yaml: str
    clean: CleanRun | None  # once the clean run has ended
    clean_experiment: int | None
    clean_log_bytes: int | None  # the size of the clean run's rank-0 log


class DrillRunner:
    """Advances every RUNNING drill, in a thread of its own beside the passes."""

    def __init__(self, store: Store, home: Home, submission: DrillServer,
                 wake_passes: Callable[[], None] = lambda: None, tick_s: float = TICK_S
                 ) -> None:
        self.store, self.home, self.submission = store, home, submission
        # How the cluster config cuts a Ray node's link (the network fault), if it says.
        self.network = network_drill(submission.settings)
        self.wake_passes = wake_passes  # new experiments: the orchestrator looks now
        self.tick_s = tick_s
        self._plans: dict[int, DrillPlan] = {}
        self._throttles: dict[int, inject.Throttle] = {}  # by run id: straggler runs
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="muster-drills", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, wait: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(wait)
        for throttle in self._throttles.values():
            throttle.stop()  # never leave a rank stopped behind us
        self._throttles.clear()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._wake.wait(min(MAX_BACKOFF_S, self.tick_s * 2 ** min(failures, 6)))
            self._wake.clear()
            try:
                self.tick()
            except MusterError as exc:  # the database is away: said (sparingly), retried
                failures += 1
                if failures in (1, 2, 5) or failures % 60 == 0:
                    log.error("drills: a step failed: %s (%d in a row)", exc, failures)
            except Exception:
                failures += 1
                if failures in (1, 2, 5) or failures % 60 == 0:
                    log.exception("drills: a step failed (%d in a row)", failures)
            else:
                failures = 0

    def tick(self) -> None:
        """One step of every RUNNING drill."""
        with self.store.session_scope() as s:
            running = list(s.scalars(select(Drill.id).where(
                Drill.state == DrillState.RUNNING).order_by(Drill.id)))
        for drill_id in running:
            self.advance(drill_id)

    def advance(self, drill_id: int) -> None:
        """The next step of one drill: its first run not ended, or the drill's end."""
        step = self._read(drill_id)
        if step is None:
            finish_drill(self.store, drill_id, DrillState.DONE)
            self._plans.pop(drill_id, None)
        elif step.state is DrillRunState.PENDING:
            self._create(step)
        elif step.state is DrillRunState.RUNNING:
            self._watch_running(step)
        elif step.state is DrillRunState.INJECTED:
            self._watch_injected(step)

    def _read(self, drill_id: int) -> Step | None:
        with self.store.session_scope() as s:
            drill = s.get_one(Drill, drill_id)
            runs = list(drill.runs)
            current = next((r for r in runs if not r.state.is_terminal()), None)
            if current is None:
                return None
            owner = s.get_one(User, drill.owner_id) if drill.owner_id is not None else None
            if owner is None:
                raise MusterError(f"drill {drill_id} has no owner")
            first = runs[0]
            clean = (CleanRun.from_json(first.outcome) if first.state == DrillRunState.ENDED
                     and first.outcome is not None else None)
            return Step(drill.id, current.id,
                        DrillFault(current.fault) if current.fault else None, current.state,
                        current.experiment_id, current.started_at, current.injected_at,
                        current.outcome, Principal(owner.id, owner.name, owner.role),
                        DrillOptions.from_json(drill.options), drill.config_yaml, clean,
                        first.experiment_id, (first.outcome or {}).get("log_bytes"))

    def _plan(self, step: Step) -> DrillPlan:
        if step.drill_id not in self._plans:
            self._plans[step.drill_id] = plan_drill(step.config_yaml, step.options.scale)
        return self._plans[step.drill_id]

    # -- PENDING: make the run's experiment ----------------------------------------------

    def _create(self, step: Step) -> None:
        if step.fault is None:
            return  # the clean run: its experiment is being made with the drill
        made = self._made_already(step)
        if made is None:
            try:
                made = self._make_experiment(step, step.fault)
            except MusterError as exc:  # a quota, a config the server refuses now
                self._set(step.run_id, state=DrillRunState.SKIPPED,
                          skip_reason=f"its experiment could not be made: {exc}")
                return
        if step.fault is DrillFault.CORRUPT_DATA:  # damaged before it was recorded
            self._set(step.run_id, state=DrillRunState.INJECTED, experiment_id=made,
                      injected_at=time.time(), injection="10% of the data copy's files "
                      "truncated or garbled before the run started")
        else:
            self._set(step.run_id, state=DrillRunState.RUNNING, experiment_id=made)
        self.wake_passes()

    def _made_already(self, step: Step) -> int | None:
        """The experiment a server killed after making it (and before recording it) made."""
        with self.store.session_scope() as s:
            return s.scalar(select(Experiment.id).where(
                Experiment.drill_id == step.drill_id,
                Experiment.drill_fault == str(step.fault)))

    def _make_experiment(self, step: Step, fault: DrillFault) -> int:
        plan = self._plan(step)
        data = data_path(plan, step.options)
        alter = None
        if fault is DrillFault.CORRUPT_DATA and data is not None:
            def alter(context: Path) -> None:
                inject.corrupt_files(inject.data_dir_in(context, data), 0.1,
                                     seed=step.drill_id)
        fs_bytes = self._fs_bytes(step) if fault is DrillFault.DISK_FULL else None
        new = NewExperiments([plan.run_config(step.drill_id, str(fault))],
                             context_from=step.clean_experiment,
                             drill=DrillMark(step.drill_id, str(fault), fs_bytes),
                             alter_context=alter)
        return experiments.create_experiments(self.submission, step.owner, new)[0]

    def _fs_bytes(self, step: Step) -> int:
        """The clean run's run directory's size, and a margin: room to run until filled."""
        trial = self._trial(step.clean_experiment)
        used = 0
        if trial is not None:
            root = self.home.run_dir(trial["uuid"]).path
            used = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()
                       and not p.is_symlink())
        return min(MAX_FS_BYTES, used * 2 + FS_MARGIN)

    # -- RUNNING: wait until the fault is due, then inject it ----------------------------

    def _watch_running(self, step: Step) -> None:
        trial = self._trial(step.experiment_id)
        if trial is None:
            self._end_if_gone(step)
            return
        if step.fault is None:
            self._watch_clean(step, trial)
            return
        if trial["state"].is_at_rest():
            self._end(step, {"name": str(step.fault), "injected_at": None,
                             "state": str(trial["state"]), "class": trial["reason"],
                             "message": f"the run ended ({trial['verdict']}) before the "
                                        "fault was due", "caught": None,
                             "detect_seconds": None, "advice": None,
                             "trial_id": trial["id"], "verdict": trial["verdict"]})
            return
        if trial["state"] != TrialState.RUNNING:
            return
        started = step.started_at
        if started is None:
            self._set(step.run_id, started_at=time.time())
            return
        if self._due(step, trial, started):
            self._inject(step, trial)

    def _watch_clean(self, step: Step, trial: api.TrialDetail) -> None:
        if trial["state"] == TrialState.RUNNING and step.started_at is None:
            self._set(step.run_id, started_at=time.time())
        if not trial["state"].is_at_rest():
            return
        clean = clean_run(trial)
        self._end(step, {**clean.to_json(), "trial_id": trial["id"],
                         "verdict": trial["verdict"], "log_bytes": _log_bytes(trial)})
        if trial["state"] != TrialState.SUCCEEDED:
            self._skip_the_rest(step.drill_id, f"the clean run ended {trial['verdict']}: "
                                "faults are judged beside a clean run that succeeded; "
                                "make that pass first")

    def _due(self, step: Step, trial: api.TrialDetail, started: float) -> bool:
        """Whether the run is `at` of its way: by its progress where muster knows its
        planned length, by its rank-0 log against the clean run's (output grows with
        the work done, and a cold start's import time does not count), else by time."""
        at = step.options.at
        progress = trial["progress"]
        if progress is not None and progress["fraction"] is not None \
                and progress["fraction"] >= at:
            return True
        clean_log = step.clean_log_bytes
        if clean_log:
            return _log_bytes(trial) >= at * clean_log
        seconds = step.clean.seconds if step.clean is not None else None
        return time.time() - started >= at * (seconds or 10.0)

    def _inject(self, step: Step, trial: api.TrialDetail) -> None:
        assert step.fault is not None
        at = time.time()
        outcome: dict[str, Any] = {"written_at_injection": self._written(trial),
                                   "attempt_at_injection": _running(trial)["number"]}
        self._set(step.run_id, state=DrillRunState.INJECTED, injected_at=at,
                  injection="being injected", outcome=outcome)
        try:
            done = self._act(step, trial, outcome)
        except InjectionError as exc:
            self._set(step.run_id, injection=f"not injected: {exc}",
                      outcome={**outcome, "not_injected": str(exc)})
            self._kill(step)
            return
        self._set(step.run_id, injection=done, outcome=outcome)

    def _act(self, step: Step, trial: api.TrialDetail, outcome: dict[str, Any]) -> str:
        """Inject the step's fault; returns what was done (`outcome` may gain what the
        watch needs later)."""
        fault = step.fault
        attempt = self._attempt_dir(trial)
        rank = max(0, len(_running(trial)["replicas"]) - 1)
        if fault is DrillFault.DROP_DATA:
            data = data_path(self._plan(step), step.options)
            run = self.home.run_dir(trial["uuid"])
            hidden = inject.hide_files(inject.data_dir_in(run.workdir, str(data)),
                                       run.path / "drill-hidden", 0.1, seed=step.drill_id)
            return f"{len(hidden)} of the data's files hidden mid-run"
        if fault is DrillFault.KILL_RANK:
            return inject.kill_rank(attempt, rank)
        if fault is DrillFault.HANG:
            return inject.hang_rank(attempt, rank)
        if fault is DrillFault.STRAGGLER:
            throttle = inject.Throttle(attempt, rank)
            self._throttles[step.run_id] = throttle
            return throttle.start()
        if fault is DrillFault.DISK_FULL:
            written = inject.fill(self.home.run_dir(trial["uuid"]).path)
            return f"the run's file system filled ({written:,} bytes of ballast)"
        if fault is DrillFault.OOM:
            return inject.squeeze_memory(attempt, rank)
        if fault is DrillFault.NAN:
            return inject.request_nan(attempt, 0)
        if fault is DrillFault.SERVER_RESTART:
            self._set(step.run_id, injection="SIGKILL to the server, started again")
            return restart_server(self.home.root / "server.log")
        if fault is DrillFault.NETWORK and self.network is not None:
            rank = link.rank_to_cut(attempt, len(_running(trial)["replicas"]))
            cut = link.cut_link(attempt, rank, self.network, self.home.root / "server.log")
            outcome["link_helper"] = [cut.helper.pid, cut.helper.start_ticks]
            outcome["link_restored_by"] = cut.back_by
            return cut.said
        raise InjectionError(f"{fault} cannot be injected on this server")

    # -- INJECTED: wait for the end, judge it --------------------------------------------

    def _watch_injected(self, step: Step) -> None:
        assert step.fault is not None and step.injected_at is not None
        trial = self._trial(step.experiment_id)
        if trial is None:
            self._end_if_gone(step)
            return
        outcome = step.outcome or {}
        if not trial["state"].is_at_rest():
            self._keep_throttling(step, trial)
            if "timed_out" not in outcome and "not_injected" not in outcome \
                    and time.time() > step.injected_at + self._deadline(step):
                self._set(step.run_id, outcome={**outcome, "timed_out": self._deadline(step)})
                self._kill(step)
            return
        if self._link_still_cut(outcome):
            return  # the next run starts once the cut link is back
        self._clean_up(step, trial)
        clean = step.clean or CleanRun("UNKNOWN", None, None, {})
        if "not_injected" not in outcome and self._too_late(outcome, trial) and (
                step.fault.must_survive or not self._named(step, trial)):
            outcome = {"not_injected": "the run wrote nothing after the fault, which may have "
                       "come after its work was done: drill with a larger --scale (the clean "
                       f"run took {span(clean.seconds) if clean.seconds else 'an unknown time'})"}
        if "not_injected" in outcome or self._nan_unused(step, trial):
            why = outcome.get("not_injected") or ("the script reported no metrics through "
                                                  "the harness after the request")
            row = {"name": str(step.fault), "injected_at": None, "state": str(trial["state"]),
                   "class": trial["reason"], "message": f"not injected: {why}",
                   "caught": None, "detect_seconds": None, "advice": None,
                   "trial_id": trial["id"], "verdict": trial["verdict"]}
        else:
            row = judge(step.fault, trial, step.injected_at, clean,
                        timed_out=outcome.get("timed_out"), timeout=self._timeout(step))
        self._end(step, row)
        self._settle_suspect(step, trial)

    @staticmethod
    def _link_still_cut(outcome: dict[str, Any]) -> bool:
        """A network fault's helper has not restored the link yet (nor given up)."""
        helper = outcome.get("link_helper")
        return (helper is not None and time.time() < outcome.get("link_restored_by", 0.0)
                and is_alive(ProcessIdentity(int(helper[0]), int(helper[1]))))

    def _settle_suspect(self, step: Step, trial: api.TrialDetail) -> None:
        """A fault's run that ended SUSPECT, as its fault should make it, is rejected in the
        owner's name with a note that says so: it is a drill's, not a result to review (and
        its experiment may then close)."""
        if trial["state"] != TrialState.SUSPECT:
            return
        note = (f"drill {step.drill_id}: the {step.fault} run, SUSPECT as the fault it ran "
                "under should make it (rejected by the drill)")
        with contextlib.suppress(Conflict):  # reviewed meanwhile
            experiments.review_trial(self.store, step.owner, trial["id"], "reject", note)

    def _named(self, step: Step, trial: api.TrialDetail) -> bool:
        """Whether muster named the fault, whenever the run ended: an attempt failed after
        it, or the run did not end as the clean run did."""
        clean = step.clean or CleanRun("UNKNOWN", None, None, {})
        assert step.fault is not None and step.injected_at is not None
        return bool(judge(step.fault, trial, step.injected_at, clean)["caught"])

    def _written(self, trial: api.TrialDetail) -> int:
        """What rank 0 of the latest attempt wrote: its log and its metrics file."""
        if not trial["attempts"]:
            return 0
        number = _running(trial)["number"]
        files = self.home.run_dir(trial["uuid"]).attempt(number).rank(0)
        return _log_bytes(trial) + _size(files.metrics)

    def _too_late(self, outcome: dict[str, Any], trial: api.TrialDetail) -> bool:
        """A mid-run fault after which the attempt it hit wrote nothing more: it may have
        come after the work was done (corrupt-data records no log size: never late)."""
        before = outcome.get("written_at_injection")
        same = outcome.get("attempt_at_injection") == _running(trial)["number"]
        return before is not None and same and self._written(trial) <= before

    def _keep_throttling(self, step: Step, trial: api.TrialDetail) -> None:
        """A straggler's throttle lives in this server's memory: a server started again
        mid-run (or a restart of the rank's attempt) throttles the rank that runs now."""
        if step.fault is not DrillFault.STRAGGLER or trial["state"] != TrialState.RUNNING:
            return
        throttle = self._throttles.get(step.run_id)
        attempt = self._attempt_dir(trial)
        if throttle is not None and throttle.attempt_dir == attempt:
            return
        if throttle is not None:
            throttle.stop()
        rank = max(0, len(_running(trial)["replicas"]) - 1)
        self._throttles[step.run_id] = fresh = inject.Throttle(attempt, rank)
        with contextlib.suppress(InjectionError):  # it ended meanwhile: nothing to slow
            fresh.start()

    def _deadline(self, step: Step) -> float:
        clean = step.clean.seconds if step.clean and step.clean.seconds else 30.0
        down = self.network.down_for if step.fault is DrillFault.NETWORK and self.network \
            else 0.0
        return max(MIN_DEADLINE_S, 3 * clean) + down + min(self._timeout(step) or 0.0,
                                                            MAX_TIMEOUT_WAIT_S)

    def _timeout(self, step: Step) -> float | None:
        """What muster waits on before it calls a silent run stuck."""
        config = self._plan(step).config
        policy = config.failure_policy
        if config.harness:
            return policy.heartbeat_timeout
        return policy.silence_timeout

    def _nan_unused(self, step: Step, trial: api.TrialDetail) -> bool:
        if step.fault is not DrillFault.NAN:
            return False
        attempts = self.home.run_dir(trial["uuid"]).attempt_numbers()
        return not any(self.home.run_dir(trial["uuid"]).attempt(n).rank(0).drill_nan_done
                       .exists() for n in attempts)

    def _clean_up(self, step: Step, trial: api.TrialDetail) -> None:
        """Leave nothing of the fault behind: a rank continued, the small file system's
        files moved to disk."""
        throttle = self._throttles.pop(step.run_id, None)
        if throttle is not None:
            throttle.stop()
        if step.fault is DrillFault.HANG:
            for number in self.home.run_dir(trial["uuid"]).attempt_numbers():
                attempt = self.home.run_dir(trial["uuid"]).attempt(number).path
                for rank in range(len(_running(trial)["replicas"])):
                    inject.resume_rank(attempt, rank)
        if step.fault is DrillFault.DISK_FULL:
            inject.release_small_fs(self.home.run_dir(trial["uuid"]).path)

    # -- the store ------------------------------------------------------------------------

    def _trial(self, experiment_id: int | None) -> api.TrialDetail | None:
        if experiment_id is None:
            return None
        with self.store.session_scope() as s:
            exp = s.get(Experiment, experiment_id)
            trial_id = exp.trials[0].id if exp is not None and exp.trials else None
        return None if trial_id is None else experiments.describe_trial(self.store, trial_id)

    def _end_if_gone(self, step: Step) -> None:
        """A run whose experiment was deleted (or made no trial) ends unjudged."""
        if not self._experiment_ended(step.experiment_id):
            return  # its trial is being made
        self._end(step, {"name": str(step.fault) if step.fault else None, "injected_at": None,
                         "state": None, "class": None, "caught": None,
                         "message": "its experiment was deleted or made no trial",
                         "detect_seconds": None, "advice": None})
        if step.fault is None:
            self._skip_the_rest(step.drill_id, "the clean run's experiment is gone")

    def _experiment_ended(self, experiment_id: int | None) -> bool:
        with self.store.session_scope() as s:
            exp = s.get(Experiment, experiment_id) if experiment_id is not None else None
            return exp is None or exp.state.is_terminal()

    def _attempt_dir(self, trial: api.TrialDetail) -> Path:
        number = _running(trial)["number"]
        return self.home.run_dir(trial["uuid"]).attempt(number).path

    def _kill(self, step: Step) -> None:
        if step.experiment_id is None:
            return
        with contextlib.suppress(Conflict):  # it ended meanwhile: nothing to kill
            experiments.kill_experiment(self.store, step.owner, step.experiment_id)
        self.wake_passes()

    def _set(self, run_id: int, **values: Any) -> None:
        with self.store.session_scope() as s:
            run = s.get_one(DrillRun, run_id)
            for name, value in values.items():
                setattr(run, name, value)

    def _end(self, step: Step, outcome: dict[str, Any]) -> None:
        outcome = {**outcome, "experiment_id": step.experiment_id}
        self._set(step.run_id, state=DrillRunState.ENDED, outcome=outcome)

    def _skip_the_rest(self, drill_id: int, why: str) -> None:
        with self.store.session_scope() as s:
            for run in s.get_one(Drill, drill_id).runs:
                if run.state == DrillRunState.PENDING:
                    run.state, run.skip_reason = DrillRunState.SKIPPED, why


def _log_bytes(trial: api.TrialDetail) -> int:
    """The size of rank 0's log in the trial's latest attempt (0: none yet)."""
    replicas = _running(trial)["replicas"] if trial["attempts"] else []
    for replica in replicas:
        if replica["rank"] == 0:
            try:
                return os.stat(replica["log_path"]).st_size
            except OSError:
                return 0
    return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _running(trial: api.TrialDetail) -> api.AttemptView:
    """The trial's latest attempt that is not a warm standby waiting to be promoted: the one
    that runs (a fault is injected into it, and its output read), or ran last."""
    attempts = trial["attempts"]
    return next((a for a in reversed(attempts) if not a["standby"]), attempts[-1])
