"""Retention: what the cluster config's `retention:` removes of ended experiments (pure).

```yaml
retention: {logs_after: 90d, runs_after: 180d, keep_registered: true, keep_labels: [keep]}
```

Counted from the end of a trial's experiment (`Experiment.ended_at`), a trial loses

- past `runs_after`, its whole run: its run directory (logs, working directory,
  environment layer, every attempt's files), its checkpoints (in storage, in the run
  directory, in the restart cache) and its artifact set (the run directory's copy and
  storage's);
- past `logs_after` (and before `runs_after`, or while its run is held), its replicas'
  logs and their indexes.

Never touched: anything of an experiment that has not ended, that is being deleted (`muster
experiment delete` removes it whole), or that carries one of `keep_labels`; anything of a
trial that has not ended (a SUSPECT one waits for a review, with its evidence); the run of
a trial one of whose checkpoints something holds (`pins.held`: a model version, while
`keep_registered`; an experiment warm-starting from it that has not ended): that
checkpoint may live only in the run directory, so the run stays whole and only its logs
may go; the run of a trial whose artifacts are still being collected (the next sweep
decides). The records stay: experiments, trials, attempts, events and metrics, so history
and usage stay exact; a removed checkpoint's row becomes `deleted` with its reason.

Like checkpoint GC (`planner`), deciding is apart from doing: `decide` judges one trial from
facts read once (`TrialFacts`), `retention_sweep` measures what the decision covers into
plan lines (`Line`, with sizes: what `muster gc runs --dry-run` prints) and carries them out
in the storage worker's thread. Nothing is removed before its removal is recorded
(invariant 9): an event per trial naming each line, its size and the rule, and the trial's
`logs_removed_at` / `files_removed_at`, committed together first; so the readers of a log
or an artifact answer "removed by retention on ..." (`logs_gone`, `files_gone`) rather
than with an empty log, and a sweep cut short is finished by the next one, whose plan
holds what still exists.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from muster.config.cluster import RetentionConfig
from muster.config.units import format_duration
from muster.sizes import format_size
from muster.states import RetentionItem, TrialState
from muster.words import count, span

__all__ = ["Decision", "Kept", "Line", "Rules", "TrialFacts", "decide", "event_message",
           "experiment_kept", "files_gone", "logs_gone", "stamp"]

LOGS_KEY = "retention.logs_after"
RUNS_KEY = "retention.runs_after"


@dataclass(frozen=True)
class Rules:
    """The cluster config's `retention`, as the planner reads it."""

    logs_after: float | None = None
    runs_after: float | None = None
    keep_registered: bool = True
    keep_labels: frozenset[str] = frozenset()

    @classmethod
    def of(cls, config: RetentionConfig | None) -> Rules | None:
        """The rules of `config`; None when it removes nothing (absent, or neither age)."""
        if config is None or (config.logs_after is None and config.runs_after is None):
            return None
        return cls(config.logs_after, config.runs_after, config.keep_registered,
                   frozenset(config.keep_labels))

    @property
    def youngest(self) -> float:
        """The shortest age at which anything goes: younger experiments are not read."""
        return min(a for a in (self.logs_after, self.runs_after) if a is not None)

    def words(self, scope: RetentionItem) -> str:
        """The rule behind a removal, as the config says it: "retention.runs_after 180d"."""
        if scope is RetentionItem.LOGS and self.logs_after is not None:
            return f"{LOGS_KEY} {format_duration(self.logs_after)}"
        assert self.runs_after is not None  # (a run goes by runs_after alone)
        return f"{RUNS_KEY} {format_duration(self.runs_after)}"


@dataclass(frozen=True)
class TrialFacts:
    """What the planner needs to know of one trial of an ended experiment."""

    id: int
    ended_at: float  # its experiment's end
    state: TrialState
    # Why its checkpoints are held, one reason each ("checkpoint step-3-ab12: registered
    # as digits v1: the registry holds it"): its run stays.
    holds: tuple[str, ...] = ()
    artifacts_pending: bool = False  # its artifact set is still to be copied


@dataclass(frozen=True)
class Decision:
    """What retention does to one trial: remove its logs or its whole run (`scope`, by
    `rule`), or nothing; `kept` says why something past a rule stays."""

    trial_id: int
    scope: RetentionItem | None  # LOGS, RUN, or None
    rule: str = ""
    kept: str | None = None


@dataclass(frozen=True)
class Line:
    """One line of a retention plan: one thing of one trial to remove, and its size."""

    what: RetentionItem
    experiment_id: int
    experiment_name: str
    trial_id: int
    name: str | None  # a checkpoint's name, or the artifact set's attempt ("attempt 2")
    bytes: int
    files: int
    at_least: bool  # the count stopped early (a very large tree): bytes and files at least
    ended_at: float  # its experiment's end
    rule: str  # "retention.runs_after 180d"


@dataclass(frozen=True)
class Kept:
    """Something past a rule that stays, and why (a whole experiment when `trial_id` is
    None)."""

    experiment_id: int
    experiment_name: str
    trial_id: int | None
    why: str


def experiment_kept(labels: Collection[str], rules: Rules) -> str | None:
    """Why an ended experiment keeps everything: it carries one of `keep_labels`."""
    kept = sorted(set(labels) & rules.keep_labels)
    return f"labelled {kept[0]!r} (retention.keep_labels)" if kept else None


def decide(trial: TrialFacts, rules: Rules, at: float) -> Decision | None:
    """What goes of one trial of an ended experiment that carries none of `keep_labels`, at
    time `at`; None while it is younger than every rule."""
    age = at - trial.ended_at
    runs_due = rules.runs_after is not None and age >= rules.runs_after
    logs_due = rules.logs_after is not None and age >= rules.logs_after
    if not (runs_due or logs_due):
        return None
    if not trial.state.is_terminal():
        why = ("SUSPECT: its evidence stays until it is reviewed"
               if trial.state is TrialState.SUSPECT else f"{trial.state}: it has not ended")
        return Decision(trial.id, None, kept=why)
    if runs_due and not trial.holds and not trial.artifacts_pending:
        return Decision(trial.id, RetentionItem.RUN, rules.words(RetentionItem.RUN))
    kept = None
    if runs_due:
        kept = ("its artifacts are still being collected" if trial.artifacts_pending else
                "its run stays: " + "; ".join(trial.holds)
                + (" (retention.keep_registered)" if rules.keep_registered else ""))
    if logs_due:
        return Decision(trial.id, RetentionItem.LOGS, rules.words(RetentionItem.LOGS), kept)
    return Decision(trial.id, None, kept=kept)


def stamp(at: float) -> str:
    """A time in event messages and answers: "2026-06-01 12:00 UTC"."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def event_message(lines: Sequence[Line]) -> str:
    """The event recorded before one trial's `lines` (all by one rule) are removed."""
    first = lines[0]
    return (f"{', '.join(_line_words(line) for line in lines)} removed: experiment "
            f"{first.experiment_id} ({first.experiment_name}) ended {stamp(first.ended_at)}, "
            f"past {first.rule}")


def _line_words(line: Line) -> str:
    size = (f"at least {format_size(line.bytes)} in {count(line.files, 'file')}"
            if line.at_least else f"{format_size(line.bytes)} in {count(line.files, 'file')}")
    if line.what is RetentionItem.RUN:
        return f"the run directory of trial {line.trial_id} ({size})"
    if line.what is RetentionItem.LOGS:
        return f"the logs of trial {line.trial_id} ({size})"
    if line.what is RetentionItem.CHECKPOINT:
        return f"checkpoint {line.name} ({size})"
    return f"the artifacts of {line.name} ({size})"


def logs_gone(trial_id: int, logs_removed_at: float | None, files_removed_at: float | None,
              ended_at: float | None) -> str | None:
    """Why a trial's logs cannot be read: retention removed them (alone, or with its run);
    None when it did not."""
    if files_removed_at is not None:
        return files_gone(trial_id, files_removed_at, ended_at)
    if logs_removed_at is None:
        return None
    return (f"trial {trial_id}'s logs were removed by retention on {stamp(logs_removed_at)}"
            f"{_after(logs_removed_at, ended_at)} (the cluster config's {LOGS_KEY}); its "
            f"metrics, checkpoints and events stay: `muster events --trial {trial_id}`")


def files_gone(trial_id: int, files_removed_at: float | None,
               ended_at: float | None) -> str | None:
    """Why a trial's run files (logs, artifacts) cannot be read: retention removed its run;
    None when it did not."""
    if files_removed_at is None:
        return None
    return (f"trial {trial_id}'s run directory (its logs and artifacts) was removed by "
            f"retention on {stamp(files_removed_at)}{_after(files_removed_at, ended_at)} "
            f"(the cluster config's {RUNS_KEY}); its metrics, registered checkpoints and "
            f"events stay: `muster events --trial {trial_id}`")


def _after(removed_at: float, ended_at: float | None) -> str:
    return "" if ended_at is None else f", {span(removed_at - ended_at)} after its " \
                                       "experiment ended"
