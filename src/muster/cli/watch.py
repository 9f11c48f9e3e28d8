"""`muster experiment watch`: an experiment's search, live, until the experiment ends.

Plan, then act: `progress` reads the experiment (`api.ExperimentDetail`) into a
`Progress`, and `summary_line` and `progress_view` show it; `watch` polls and draws. On a
terminal the view is a Rich Live display; otherwise one line is printed each time the
summary changes, so a log or a CI job gets a readable history instead of redraws.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.client import Client
from muster.states import ExperimentState, TrialState
from muster.verdicts import VerdictCounts
from muster.words import progress_done, progress_line, progress_percent

if TYPE_CHECKING:
    from muster import api

__all__ = ["POLL_S", "LinePrinter", "Progress", "poll", "progress", "progress_view", "summary_line",
           "watch"]

POLL_S = 0.5
RECENT_TRIALS = 8  # rows of the live table: the newest trials


@dataclass(frozen=True)
class TrialRow:
    id: int
    number: int  # its place in the search, from 0
    state: str
    early_stopped: bool
    best: float | str | None  # its best value of the searcher's metric
    verified: bool | None  # its verdict (`muster.verdicts`): null while it has not ended
    verdict: str
    progress: api.TrialProgress | None = None  # while RUNNING (`muster.services.progress`)


@dataclass(frozen=True)
class Best:
    trial_id: int
    number: int
    value: float | str
    hparams: api.Hparams
    early_stopped: bool


@dataclass(frozen=True)
class Progress:
    """What the watch shows of one poll of the experiment."""

    experiment_id: int
    name: str
    state: str
    searcher: str
    metric: str | None
    max_trials: int
    ended: int
    running: int
    queued: int
    remaining: int
    early_stopped: int
    suspect: int
    verdicts: VerdictCounts
    best: Best | None
    recent: tuple[TrialRow, ...]
    elapsed_s: float | None
    # (trial id, its progress) of each RUNNING trial that reported progress, by number.
    running_progress: tuple[tuple[int, api.TrialProgress], ...] = ()

    def finished(self) -> bool:
        """The experiment has ended, or nothing will run again until a person reviews its
        SUSPECT trials (which keeps it ACTIVE)."""
        if ExperimentState(self.state).is_terminal():
            return True
        return (self.suspect > 0 and self.remaining == 0 and self.running == 0
                and self.queued == 0)


def progress(exp: api.ExperimentDetail, now: float | None = None) -> Progress:
    """The experiment's progress (as `Client.get_experiment_whole` gives it: every trial)."""
    search = exp["search"]
    metric = search.get("metric")
    trials = sorted(exp["trials"], key=lambda t: (t["number"], t["id"]))
    rows = tuple(TrialRow(t["id"], t["number"], t["state"], t["early_stopped"],
                          t["best_validation"].get(metric) if metric else None,
                          render.verified(t), render.verdict(t), t.get("progress"))
                 for t in trials[-RECENT_TRIALS:])
    best = search.get("best")
    return Progress(
        experiment_id=exp["id"], name=exp["name"], state=exp["state"],
        searcher=search["searcher"], metric=metric, max_trials=search["max_trials"],
        ended=search["ended"], running=search["running"], queued=search["queued"],
        remaining=search["remaining"],
        early_stopped=sum(t["early_stopped"] for t in trials),
        suspect=sum(t["state"] == TrialState.SUSPECT for t in trials),
        verdicts=render.verdict_counts(exp),
        best=None if best is None else Best(best["trial_id"], best["number"], best["value"],
                                             best["hparams"], best["early_stopped"]),
        recent=rows, elapsed_s=_elapsed(exp, now),
        running_progress=tuple((t["id"], reported) for t in trials
                               if (reported := t.get("progress")) is not None),
    )


def summary_line(p: Progress) -> str:
    """One line: the counts, the trials by verdict and the best trial so far (plain text,
    no markup)."""
    counts = (f"experiment {p.experiment_id} {p.state}: {p.ended} of {p.max_trials} trials "
              f"ended ({p.early_stopped} stopped early), {p.running} running, "
              f"{p.queued} queued, {p.remaining} to draw; {p.verdicts.words()}")
    line = f"{counts}; {best_text(p)}" if p.metric else counts
    return f"{line}; {running}" if (running := running_text(p)) else line


def running_text(p: Progress) -> str:
    """E.g. "trial 13 at 34%, trial 14 at 2,000 steps": how far each RUNNING trial has
    come, in whole percent (the one-line history gets a line per percent, not per step)."""
    return ", ".join(
        f"trial {trial_id} at " + (progress_done(progress) if progress["planned"] is None
                                   else f"{progress_percent(progress)}%")
        for trial_id, progress in p.running_progress)


def best_text(p: Progress) -> str:
    """E.g. "best val_accuracy 0.986111 in trial 14 (#11, stopped early): lr=0.0312, ..."."""
    if p.best is None:
        return f"no {p.metric} reported yet"
    early = ", stopped early" if p.best.early_stopped else ""
    return (f"best {p.metric} {render.number(p.best.value)} in trial {p.best.trial_id} "
            f"(#{p.best.number}{early}): {render.hparams_text(p.best.hparams)}")


def progress_view(p: Progress) -> RenderableType:
    """The live display: a heading, the counts, the best so far, the newest trials."""
    elapsed = "" if p.elapsed_s is None else f" · {p.elapsed_s:.0f} s"
    lines: list[RenderableType] = [
        f"Experiment {p.experiment_id} [bold]{escape(p.name)}[/]: {render.state(p.state)} · "
        f"{escape(p.searcher)}{elapsed}",
        f"trials: [bold]{p.ended}[/] of {p.max_trials} ended · {p.early_stopped} stopped "
        f"early · {p.running} running · {p.queued} queued · {p.remaining} to draw",
        _verdicts_line(p.verdicts),
    ]
    if p.metric:
        lines.append(escape(best_text(p)))
    lines += [f"trial {trial_id}: {escape(progress_line(progress))}"
              for trial_id, progress in p.running_progress]
    lines.append(_trials_table(p))
    return Group(*lines)


def _verdicts_line(counts: VerdictCounts) -> str:
    """`verdicts: 2 verified · 1 not verified · 1 SUSPECT`, the ones to look at in yellow."""
    def shown(number: int, words: str) -> str:
        return f"[yellow]{number} {words}[/]" if number else f"{number} {words}"
    return (f"verdicts: [green]{counts.verified} verified[/] · "
            f"{shown(counts.not_verified, 'not verified')} · {shown(counts.suspect, 'SUSPECT')}")


def _trials_table(p: Progress) -> Table:
    table = Table("Trial", "#", "State", "Stopped early", f"Best {escape(p.metric or '')}".strip(),
                  "Verdict", "Progress",
                  title=f"newest {len(p.recent)} trials" if p.recent else "no trials yet")
    for row in p.recent:
        table.add_row(str(row.id), str(row.number), render.state(row.state),
                      "yes" if row.early_stopped else "-",
                      "-" if row.best is None else render.number(row.best),
                      render.verdict_markup(row.verdict, row.state, row.verified),
                      escape(progress_line(row.progress)))
    return table


def watch(client: Client, experiment_id: int, console: Console | None = None,
          poll_s: float = POLL_S) -> api.ExperimentDetail:
    """Show the experiment's progress until it has ended (see `Progress.finished`), live on
    a terminal, else one line per change; return the experiment as last fetched."""
    console = console or render.console
    fetch = functools.partial(client.get_experiment_whole, experiment_id)  # all its trials
    if not console.is_terminal:
        return poll(fetch, LinePrinter(console), poll_s)
    with Live(console=console, auto_refresh=False) as live:
        return poll(fetch, lambda p: live.update(progress_view(p), refresh=True), poll_s)


def poll(fetch: Callable[[], api.ExperimentDetail], show: Callable[[Progress], None],
         poll_s: float) -> api.ExperimentDetail:
    """Fetch and show every `poll_s` seconds until the experiment has ended; return it."""
    while True:
        exp = fetch()
        show(p := progress(exp))
        if p.finished():
            return exp
        time.sleep(poll_s)


class LinePrinter:
    """Prints the summary line when it differs from the last one printed."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.shown: str | None = None

    def __call__(self, p: Progress) -> None:
        line = summary_line(p)
        if line != self.shown:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self.shown = line


def _elapsed(exp: api.ExperimentDetail, now: float | None) -> float | None:
    """Seconds since the experiment was created (to its end, once it has ended)."""
    created = exp.get("created_at")
    if not isinstance(created, int | float):
        return None
    end = exp.get("ended_at") or (time.time() if now is None else now)
    return max(0.0, float(end) - float(created))
