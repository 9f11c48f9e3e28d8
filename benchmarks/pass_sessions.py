"""Store transactions per supervisor pass, in steady state: how often one pass opens a session.

A pass reads every live attempt once and writes only what changed (docs/architecture.md,
"One supervisor pass"), so its cost in transactions does not grow with what an attempt
has to check. This counts `Store.session_scope` calls over `PASSES` passes for one RUNNING
attempt (with and without the harness) and for four, on a real supervisor, launcher and
SQLite store: a count, not a time, so it is exact on a noisy machine.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import yaml
from measure import expect
from muster_server import kill_trials
from report import Outcome, Table, Target
from sqlalchemy import select
from sqlalchemy.orm import Session

from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.local_placement import LocalPlacement
from muster.services.experiments import create_experiment
from muster.services.users import bootstrap, principal
from muster.states import TrialState
from muster.store import Store, Trial
from muster.supervise.supervisor import Supervisor

PASSES = 20
TARGET = 5  # per pass, one running attempt (11 before the supervisor was split)
HARNESS_LOOP = """\
import time
import muster.harness as mh
with mh.init() as ctx:
    for step in range(10**6):
        ctx.report_training(step, {"loss": 1.0 / (step + 1)})
        time.sleep(0.02)
"""
PLAIN_LOOP = "import time\ntime.sleep(600)\n"


class CountingStore(Store):
    """A store that counts the transactions it opens."""

    opened = 0

    def session_scope(self) -> AbstractContextManager[Session]:
        self.opened += 1
        return super().session_scope()


@contextmanager
def running(trials: int, harness: bool) -> Iterator[tuple[CountingStore, Supervisor]]:
    """A supervisor whose `trials` trials are all RUNNING."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-sessions-") as tmp:
        root = Path(tmp)
        home = Home(root / "home").ensure()
        store = CountingStore(f"sqlite:///{root / 'muster.db'}")
        store.upgrade()
        script = root / "job.py"
        script.write_text(HARNESS_LOOP if harness else PLAIN_LOOP)
        config = {"name": "sessions", "entrypoint": [sys.executable, str(script)],
                  "harness": harness}
        admin = principal(store, bootstrap(store, home.token_path))
        for _ in range(trials):
            create_experiment(store, home, admin, yaml.safe_dump(config), None)
        supervisor = Supervisor(store, LocalLauncher(), home, LocalPlacement(store, trials),
                                min_free_disk=0)
        try:
            for _ in range(600):
                supervisor.tick()
                if _all_running(store, trials):
                    break
            expect(_all_running(store, trials), f"{trials} trials never all ran")
            yield store, supervisor
        finally:
            kill_trials(home.root)
            store.dispose()


def _all_running(store: Store, trials: int) -> bool:
    with store.session_scope() as s:
        states = list(s.scalars(select(Trial.state)))
    return states.count(TrialState.RUNNING.value) == trials


def per_pass(trials: int, harness: bool) -> float:
    with running(trials, harness) as (store, supervisor):
        for _ in range(3):  # settle: the passes right after RUNNING may still write
            supervisor.tick()
        before = store.opened
        for _ in range(PASSES):
            supervisor.tick()
        return (store.opened - before) / PASSES


def run(quick: bool) -> Outcome:
    cases = [(1, False), (1, True), (4, True)]
    counts = {case: per_pass(*case) for case in cases}
    rows = [[str(trials), "yes" if harness else "no", f"{counts[(trials, harness)]:.1f}"]
            for trials, harness in cases]
    one = counts[(1, True)]
    return Outcome(
        name="pass_sessions",
        tables=[Table(f"Session scopes per supervisor pass ({PASSES} passes, steady state)",
                      ["running trials", "harness", "sessions per pass"], rows)],
        targets=[Target(f"one running attempt: at most {TARGET} sessions per pass",
                        f"{one:.1f}", one <= TARGET)],
        notes=["Counted, not timed: `Store.session_scope` calls per `Supervisor.tick()`. "
               "Before the supervisor was split (issue 11) one running attempt cost 11."],
        data={f"{trials}-{'harness' if harness else 'plain'}": count
              for (trials, harness), count in counts.items()},
    )


if __name__ == "__main__":
    outcome = run(quick=False)
    for table in outcome.tables:
        print(table.title)
        for row in table.rows:
            print("  ", row)
