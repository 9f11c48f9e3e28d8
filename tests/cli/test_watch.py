"""`muster experiment watch`: the pure parts on experiment JSON as the API returns it, and
the command as a real subprocess against a real server, on rows stored in its database."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from muster.cli import watch
from muster.client import Client
from muster.verdicts import verdict_of
from tests.cli.test_cli import on
from tests.server.test_search_views import add_experiment, add_trial, search_config
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # starts real processes

def trial(id_: int, number: int, state: str, *, best: float | None = None,
          early: bool = False, verified: bool = True) -> dict[str, Any]:
    """A trial as the API shows it; a SUCCEEDED one verified unless `verified` is False."""
    verification = ({"passed": state == "SUCCEEDED", "verified": verified and state == "SUCCEEDED",
                     "checks": []} if state in ("SUCCEEDED", "SUSPECT") else None)
    verdict = verdict_of(state, verification, early_stopped=early)
    return {"id": id_, "number": number, "state": state, "early_stopped": early,
            "hparams": {"lr": 0.001 * (number + 1)},
            "best_validation": {} if best is None else {"val_accuracy": best},
            "verification": verification, "verified": verdict.verified,
            "verdict": verdict.line}


def experiment(state: str = "ACTIVE", trials: list[dict[str, Any]] | None = None, *,
               remaining: int = 5, best: dict[str, Any] | None = None,
               metric: str | None = "val_accuracy") -> dict[str, Any]:
    trials = trials if trials is not None else []
    ended = sum(t["state"] in ("SUCCEEDED", "FAILED", "CANCELED", "SUSPECT") for t in trials)
    running = sum(t["state"] in ("STARTING", "RUNNING", "RESTARTING") for t in trials)
    return {"id": 7, "name": "digits-search", "state": state, "created_at": 100.0,
            "ended_at": None if state == "ACTIVE" else 160.0, "trials": trials,
            "search": {"searcher": "adaptive_asha", "metric": metric,
                       "smaller_is_better": False, "max_trials": len(trials) + remaining,
                       "max_concurrent_trials": 2, "ended": ended, "running": running,
                       "queued": len(trials) - ended - running, "remaining": remaining,
                       "best": best}}


BEST = {"trial_id": 12, "number": 1, "metric": "val_accuracy", "value": 0.9861111,
        "early_stopped": True,
        "hparams": {"lr": 0.0312345, "model": {"hidden": 128}, "opt": "[bold]"}}
MIDWAY = experiment(trials=[trial(11, 0, "SUCCEEDED", best=0.95),
                            trial(12, 1, "SUCCEEDED", best=0.9861111, early=True),
                            trial(13, 2, "RUNNING", best=0.5), trial(14, 3, "QUEUED")],
                    best=BEST)


def test_progress_counts_the_search_and_finds_the_best() -> None:
    p = watch.progress(MIDWAY, now=130.0)
    assert (p.ended, p.running, p.queued, p.remaining, p.max_trials) == (2, 1, 1, 5, 9)
    assert p.early_stopped == 1 and p.suspect == 0 and p.elapsed_s == 30.0
    assert p.best == watch.Best(12, 1, 0.9861111, BEST["hparams"], True)
    assert [(r.id, r.state, r.early_stopped, r.best) for r in p.recent] == [
        (11, "SUCCEEDED", False, 0.95), (12, "SUCCEEDED", True, 0.9861111),
        (13, "RUNNING", False, 0.5), (14, "QUEUED", False, None)]


def test_summary_line_says_everything_in_one_line() -> None:
    assert watch.summary_line(watch.progress(MIDWAY)) == (
        "experiment 7 ACTIVE: 2 of 9 trials ended (1 stopped early), 1 running, 1 queued, "
        "5 to draw; 2 verified, 0 not verified, 0 SUSPECT; best val_accuracy 0.986111 in "
        "trial 12 (#1, stopped early): lr=0.0312345, model.hidden=128, opt=[bold]")
    assert watch.summary_line(watch.progress(experiment())) == (
        "experiment 7 ACTIVE: 0 of 5 trials ended (0 stopped early), 0 running, 0 queued, "
        "5 to draw; 0 verified, 0 not verified, 0 SUSPECT; no val_accuracy reported yet")
    single = experiment("COMPLETED", [trial(3, 0, "SUCCEEDED")], remaining=0, metric=None)
    assert watch.summary_line(watch.progress(single)) == (
        "experiment 7 COMPLETED: 1 of 1 trials ended (0 stopped early), 0 running, 0 queued, "
        "0 to draw; 1 verified, 0 not verified, 0 SUSPECT")


def test_the_summary_counts_trials_by_verdict() -> None:
    exp = experiment("ACTIVE", [trial(1, 0, "SUCCEEDED"), trial(2, 1, "SUCCEEDED", verified=False),
                                trial(3, 2, "SUSPECT"), trial(4, 3, "RUNNING")],
                     remaining=0, metric=None)
    assert watch.summary_line(watch.progress(exp)).endswith(
        "; 1 verified, 1 not verified, 1 SUSPECT")
    rows = {row.id: (row.verified, row.verdict) for row in watch.progress(exp).recent}
    assert rows == {1: (True, "verified"),
                    2: (False, "exit 0 — not verified: no check inspected its results"),
                    3: (False, "SUSPECT: a check failed"), 4: (None, "running")}
    # The server's counts, when it sends them, are the ones shown.
    counted = exp | {"verdicts": {"verified": 5, "not_verified": 0, "suspect": 2}}
    assert watch.summary_line(watch.progress(counted)).endswith(
        "; 5 verified, 0 not verified, 2 SUSPECT")


def test_the_table_shows_only_the_newest_trials() -> None:
    trials = [trial(100 + n, n, "SUCCEEDED", best=n / 100) for n in range(12)]
    p = watch.progress(experiment("COMPLETED", trials, remaining=0))
    assert [r.number for r in p.recent] == list(range(12 - watch.RECENT_TRIALS, 12))


@pytest.mark.parametrize(("exp", "finished"), [
    (MIDWAY, False),
    (experiment("PAUSED", [trial(1, 0, "PAUSED")]), False),
    (experiment("COMPLETED", [trial(1, 0, "SUCCEEDED")], remaining=0), True),
    (experiment("ERROR", [trial(1, 0, "FAILED")], remaining=0), True),
    (experiment("CANCELED", [trial(1, 0, "CANCELED")], remaining=3), True),
    # held ACTIVE by a SUSPECT trial, with nothing left to run: only a person can end it
    (experiment("ACTIVE", [trial(1, 0, "SUSPECT"), trial(2, 1, "SUCCEEDED")], remaining=0),
     True),
    (experiment("ACTIVE", [trial(1, 0, "SUSPECT"), trial(2, 1, "RUNNING")], remaining=0),
     False),
    (experiment("ACTIVE", [trial(1, 0, "SUSPECT")], remaining=1), False),
    # every trial ended, the experiment's own end is one supervisor pass away
    (experiment("ACTIVE", [trial(1, 0, "SUCCEEDED")], remaining=0), False),
])
def test_finished(exp: dict[str, Any], finished: bool) -> None:
    assert watch.progress(exp).finished() is finished


def test_poll_shows_each_fetch_and_prints_a_line_only_when_it_changes() -> None:
    done = experiment("COMPLETED", [trial(11, 0, "SUCCEEDED", best=0.95)], remaining=0,
                      best=BEST | {"trial_id": 11, "number": 0, "value": 0.95})
    fetched = iter([experiment(), experiment(), MIDWAY, MIDWAY, done, experiment()])
    out = io.StringIO()
    printer = watch.LinePrinter(Console(file=out, width=80))

    last = watch.poll(lambda: next(fetched), printer, poll_s=0)

    assert last is done
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # one per change, each whole however wide
    assert lines[0].startswith("experiment 7 ACTIVE: 0 of 5")
    assert lines[1].startswith("experiment 7 ACTIVE: 2 of 9")
    assert lines[2].startswith("experiment 7 COMPLETED: 1 of 1 trials ended")


def test_live_view_renders_counts_best_and_trials() -> None:
    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    console.print(watch.progress_view(watch.progress(MIDWAY, now=142.0)))
    text = console.export_text()
    assert "Experiment 7 digits-search: ACTIVE · adaptive_asha · 42 s" in text
    assert ("trials: 2 of 9 ended · 1 stopped early · 1 running · 1 queued · 5 to draw"
            in text)
    assert "best val_accuracy 0.986111 in trial 12 (#1, stopped early): lr=0.0312345" in text
    assert "opt=[bold]" in text  # hyperparameter values are not markup
    assert "verdicts: 2 verified · 0 not verified · 0 SUSPECT" in text
    rows = [line.split() for line in text.splitlines() if "│" in line]
    assert ["│", "12", "│", "1", "│", "SUCCEEDED", "│", "yes", "│", "0.986111", "│",
            "verified", "(stopped", "early", "by", "the", "searcher)", "│", "-", "│"] in rows
    assert ["│", "14", "│", "3", "│", "QUEUED", "│", "-", "│", "-", "│", "queued", "│", "-",
            "│"] in rows


RUNNING_AT = {"done": 340, "planned": 1000, "unit": "steps", "fraction": 0.34,
              "rate_per_s": 2.72, "eta_seconds": 242.6, "planned_by": "ctx.plan()",
              "measured_by": "harness", "as_of": 140.0}


def test_a_running_trial_shows_its_progress_and_eta() -> None:
    trials = [trial(11, 0, "SUCCEEDED", best=0.95),
              trial(13, 1, "RUNNING") | {"progress": RUNNING_AT},
              trial(14, 2, "RUNNING") | {"progress": RUNNING_AT | {
                  "planned": None, "fraction": None, "eta_seconds": None,
                  "planned_by": None}}]
    p = watch.progress(experiment(trials=trials, metric=None))
    assert watch.summary_line(p).endswith("; trial 13 at 34%, trial 14 at 340 steps")
    console = Console(file=io.StringIO(), width=160, force_terminal=True, record=True)
    console.print(watch.progress_view(p))
    text = console.export_text()
    assert "trial 13: 340 of 1,000 steps (34%), ETA 4m 02s" in text
    assert "trial 14: 340 steps, no planned length" in text
    rows = [line.split() for line in text.splitlines() if "│" in line]
    assert ["│", "13", "│", "1", "│", "RUNNING", "│", "-", "│", "-", "│", "running", "│",
            "340", "of", "1,000", "steps", "(34%),", "ETA", "4m", "02s", "│"] in rows


# -- the command, against a real server -----------------------------------------------------


@pytest.mark.timeout(60)
def test_watch_exits_0_when_the_search_completed(server: RunningServer) -> None:
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config("random", metric="val_loss", max_trials=2),
                             state="COMPLETED", max_trials=2)
        add_trial(s, exp, 0, validation=[{"val_loss": 0.4}]).verification = {
            "passed": True, "verified": False, "checks": []}
        best = add_trial(s, exp, 1, validation=[{"val_loss": 0.3}, {"val_loss": 0.2}],
                         early_stop={"rung": 1, "step": 2, "value": 0.2})
        best.verification = {"passed": True, "verified": True, "checks": []}
        exp_id, best_id = exp.id, best.id

    done = on(server, "experiment", "watch", str(exp_id))

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"experiment {exp_id} COMPLETED: 2 of 2 trials ended (1 stopped early), 0 running, "
        f"0 queued, 0 to draw; 1 verified, 1 not verified, 0 SUSPECT; best val_loss 0.2 in "
        f"trial {best_id} (#1, stopped early): lr=0.002, model.hidden=64"]
    assert done.stderr.strip() == (f"experiment {exp_id} ended COMPLETED: 1 verified, 1 not "
                                   "verified, 0 SUSPECT")

    strict = on(server, "experiment", "watch", str(exp_id), "--require-verified")
    assert strict.returncode == 3, strict.stderr
    assert "not every SUCCEEDED trial was verified (--require-verified)" in strict.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("state", "trial_state", "says"), [
    ("ERROR", "FAILED", "ended ERROR"),
    ("ACTIVE", "SUSPECT", "is ACTIVE: its SUSPECT trials wait for `muster trial review"),
])
def test_watch_exits_1_unless_completed(
    server: RunningServer, state: str, trial_state: str, says: str
) -> None:
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config("random", max_trials=1), state=state,
                             max_trials=1)
        add_trial(s, exp, 0, trial_state)
        exp_id = exp.id

    done = on(server, "experiment", "watch", str(exp_id))

    assert done.returncode == 1, (done.stdout, done.stderr)
    assert says in done.stderr
    assert len(done.stdout.splitlines()) == 1



@pytest.mark.timeout(60)
def test_on_a_terminal_the_watch_is_a_live_view(server: RunningServer, client: Client) -> None:
    with server.store() as store, store.session_scope() as s:
        exp = add_experiment(s, search_config("random", metric="val_loss", max_trials=1),
                             state="COMPLETED", max_trials=1)
        add_trial(s, exp, 0, validation=[{"val_loss": 0.4}])
        exp_id = exp.id
    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)

    last = watch.watch(client, exp_id, console=console, poll_s=0.01)

    assert last["state"] == "COMPLETED"
    text = console.export_text()
    assert f"Experiment {exp_id} " in text and "trials: 1 of 1 ended" in text
    assert "best val_loss 0.4 in trial" in text
