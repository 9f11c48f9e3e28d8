"""Human output: Rich tables and one-line summaries of the API's shapes (`muster.api`), read
by their typed fields. Machine output is `--json`."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator, Mapping
from itertools import groupby
from typing import TYPE_CHECKING, Any, TypeAlias

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from muster.sizes import format_size
from muster.states import MetricSource, Reason, TrialState
from muster.verdicts import Verdict, VerdictCounts, check_status, count_verdicts, verdict_of
from muster.words import count

if TYPE_CHECKING:
    from muster import api
    from muster.client import Paged

# No emoji codes: a user's `a:fire:b` is shown as written, and a line with colons (every
# time of day) no longer loads rich's table of 3,600 emoji codes to look them up.
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)

STATE_STYLE = {
    "SUCCEEDED": "green", "COMPLETED": "green", "FAILED": "red", "ERROR": "red",
    "SUSPECT": "yellow", "CANCELED": "magenta", "RUNNING": "cyan", "ACTIVE": "cyan",
}


def print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def state(value: str | None) -> str:
    style = STATE_STYLE.get(value or "", "")
    return f"[{style}]{value}[/]" if style else str(value)


def when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def duration(start: float | None, end: float | None) -> str:
    return f"{end - start:.1f}s" if start and end else "-"


def experiments_table(rows: list[api.ExperimentSummary]) -> Table:
    table = Table("ID", "Name", "Owner", "State", "Trials", "Verdicts", "Created", "Ended")
    for exp in rows:
        trials = ", ".join(exp["trial_states"]) or "-"
        table.add_row(str(exp["id"]), escape(exp["name"]), escape(exp.get("owner") or "-"),
                      state(exp["state"]), trials, verdict_counts(exp).brief() or "-",
                      when(exp["created_at"]), when(exp["ended_at"]))
    return table


def trials_page_line(exp: api.ExperimentDetail) -> str | None:
    """Which of the experiment's trials a description showed and how to see the others;
    None where it showed them all."""
    shown, total, first = len(exp["trials"]), exp["trials_total"], exp["trials_offset"]
    if shown == total:
        return None
    line = (f"trials {first + 1:,} to {first + shown:,} of {total:,} shown" if shown
            else f"no trials from {first:,}: it has {total:,}")
    if (at := exp["trials_next_offset"]) is not None:
        line += (f"; the next: muster experiment describe {exp['id']} --trials-offset {at}"
                 " (or `muster trial list` / the experiment's page for a table of all)")
    return line


def page_line(what: str, page: Paged[Any], next_command: str) -> str | None:
    """Which rows of a paged list (`what`: "jobs") a command showed and the command that
    shows the next ones (`next_command`, given `--offset`); None where it showed them all."""
    shown, total, first = len(page), page.total, page.offset
    if first == 0 and shown == total:
        return None
    line = (f"{what} {first + 1:,} to {first + shown:,} of {total:,} shown" if shown
            else f"no {what} from {first:,}: there are {total:,}")
    if (at := page.next_offset) is not None:
        line += f"; the next: {next_command} --offset {at}"
    return line


def print_page_line(what: str, page: Paged[Any], next_command: str, *, as_json: bool) -> None:
    """`page_line`, where the list was cut: after a table, or on stderr beside `--json` (so
    that stdout stays JSON)."""
    if line := page_line(what, page, next_command):
        (err_console if as_json else console).print(line, markup=False, soft_wrap=True)


def trials_table(trials: list[api.TrialDetail]) -> Table:
    table = Table("Trial", "State", "Verdict", "Reason", "Restarts", "Started", "Ended")
    for trial in trials:
        table.add_row(str(trial["id"]), state(trial["state"]), styled_verdict(trial),
                      escape(trial["reason"] or "-"), str(trial["restarts"]),
                      when(trial["started_at"]), when(trial["ended_at"]))
    return table


# A trial as a list shows it, or in full: both carry its verdict.
Trial: TypeAlias = "api.TrialSummary | api.TrialDetail"


def verdict(trial: Trial) -> str:
    """The trial's verdict line as the server words it (`muster.verdicts`); from a server
    that predates it, worded here from what the trial's JSON holds."""
    line = trial.get("verdict")
    if isinstance(line, str):
        return line
    return _worded(trial).line


def verified(trial: Trial) -> bool | None:
    """The trial's `verified` (null while it has not ended), as `verdict` words it."""
    if "verdict" in trial:
        value = trial.get("verified")
        return value if isinstance(value, bool) else None
    return _worded(trial).verified


def _worded(trial: Mapping[str, Any]) -> Verdict:
    """The verdict on a trial from a server that predates `verdict`: its JSON is not
    `muster.api`'s shape, so it is read as the JSON it is."""
    return verdict_of(trial["state"], trial.get("verification"),
                      early_stopped=bool(trial.get("early_stopped")),
                      reason=trial.get("reason"), message=trial.get("message"))


VERDICT_STYLE = {"SUCCEEDED": "yellow", "SUSPECT": "yellow", "FAILED": "red"}


def styled_verdict(trial: Trial) -> str:
    """The trial's verdict line as Rich markup (`verdict_markup`)."""
    return verdict_markup(verdict(trial), trial["state"], verified(trial))


def verdict_markup(line: str, trial_state: str, is_verified: bool | None) -> str:
    """A verdict line as Rich markup: green when verified, yellow when not verified or
    SUSPECT, red when failed."""
    style = "green" if is_verified else VERDICT_STYLE.get(trial_state, "")
    return f"[{style}]{escape(line)}[/]" if style else escape(line)


def verdict_counts(exp: api.ExperimentSummary) -> VerdictCounts:
    """The experiment's trials by verdict, as the server counted them (or, from a server
    that predates the counts, from its trials)."""
    counts = exp.get("verdicts")
    if isinstance(counts, Mapping):
        return VerdictCounts.from_json(counts)
    return _counted(exp)


def _counted(exp: Mapping[str, Any]) -> VerdictCounts:
    """The verdicts of an experiment from a server that predates `verdicts`, read as the
    JSON it is: from its trials."""
    trials = exp.get("trials") or []
    return count_verdicts([t["state"] for t in trials],
                          [verified(t) for t in trials if t["state"] == TrialState.SUCCEEDED])


def attempts_table(trial: api.TrialDetail) -> Table:
    table = Table("Attempt", "Rank", "State", "Exit", "Signal", "Reason", "Duration",
                  "Peak memory", "Log")
    for attempt in trial["attempts"]:
        for rep in attempt["replicas"]:
            exit_code = "-" if rep["exit_code"] is None else str(rep["exit_code"])
            rank = str(rep["rank"]) + (f" (restart {rep['incarnation']})"
                                       if rep.get("incarnation") else "")
            number = str(attempt["number"]) + (" (standby)" if attempt.get("standby") else "")
            table.add_row(number, rank, state(attempt["state"]),
                          exit_code, rep["signal"] or "-", _reason(rep),
                          duration(rep["started_at"], rep["ended_at"]), _peak(rep),
                          _log(rep))
    return table


def _log(replica: api.ReplicaView) -> str:
    """The log's path, and the output it lost (a full disk), if any."""
    lost = replica.get("log_lost_bytes")
    path = escape(replica["log_path"])
    return f"{path} [red]({format_size(lost)} of output lost)[/]" if lost else path


def _reason(replica: api.ReplicaView) -> str:
    """The replica's reason; an OOM says who saw it ("OOM (cgroup)")."""
    oom = replica.get("oom")
    if replica["reason"] == Reason.OOM and oom:
        return f"OOM ({oom['source']})"
    return replica["reason"] or "-"


def _peak(replica: api.ReplicaView) -> str:
    """The peak memory of the replica's process group (replicas recorded before it: -)."""
    peak = replica.get("peak_rss_bytes")
    return "-" if peak is None else format_size(peak)


def resources_table(resources: list[api.ReplicaResources]) -> Table:
    """Each replica's resources, latest / peak (its `system/` series); "-" where one was
    never sampled (GPUs without NVML)."""
    table = Table("Rank", "CPU % (of one core)", "Memory (RSS)", "GPU util %", "GPU memory",
                  "Samples", title="Resources, latest / peak", title_justify="left")
    for replica in resources:
        table.add_row(str(replica["rank"]), _reading(replica["cpu_percent"], _percent),
                      _reading(replica["rss_bytes"], _size),
                      _reading(replica["gpu_util_percent"], _percent),
                      _reading(replica["gpu_memory_bytes"], _size), str(replica["samples"]))
    return table


def _reading(reading: api.ResourceReading | None, show: Callable[[float], str]) -> str:
    return "-" if reading is None else f"{show(reading['latest'])} / {show(reading['peak'])}"


def _percent(value: float) -> str:
    return f"{value:.0f}"


def _size(value: float) -> str:
    return format_size(int(value))


def ended_replicas(trial: api.TrialDetail) -> list[str]:
    """One line per ended replica: how it ended, in words (invariant 7)."""
    return [f"attempt {a['number']}: {r['message']}"
            + (f" (restart {r['incarnation']} in place)" if r.get("incarnation") else "")
            for a in trial["attempts"] for r in a["replicas"] if r["message"]]


def stack_lines(trial: api.TrialDetail) -> list[str]:
    """Where each rank's main thread was in each attempt's latest evidence bundle (a stall's,
    or `muster trial dump`'s): "attempt 2 (evidence/<id>): rank 1 waits in all_reduce at
    train.py:88", each line once."""
    lines: list[str] = []
    for attempt in trial["attempts"]:
        for rep in attempt["replicas"]:
            summary, bundle = rep.get("stack_summary"), rep.get("evidence")
            for line in (summary or "").splitlines():
                shown = f"attempt {attempt['number']} ({bundle}): {line}"
                if shown not in lines:
                    lines.append(shown)
    return lines


def metrics_table(reports: list[api.MetricReport]) -> Table:
    """Step, kind ("(log)" after it when muster read the report from the rank's log), and
    one column per metric name (in order of first appearance)."""
    names = list(dict.fromkeys(name for r in reports for name in r["metrics"]))
    table = Table("Step", "Kind", *map(escape, names))  # user-chosen names are not markup
    for report in reports:
        values = report["metrics"]
        kind = report["kind"] + (" (log)" if report.get("source") == MetricSource.LOG else "")
        table.add_row(str(report["step"]), kind,
                      *(number(values[n]) if n in values else "-" for n in names))
    return table


def search_lines(search: api.SearchProgress) -> list[str]:
    """The search's progress in three lines: how it searches, how far it is, the best so far."""
    direction = "smaller is better" if search["smaller_is_better"] else "larger is better"
    unit = search.get("time_metric") or search.get("max_length_unit") or "steps"
    length = (f", {search['max_length']:,} {unit} per trial" if search.get("max_length")
              else "")
    lines = [
        f"Search: {search['searcher']} on {search['metric']} ({direction}), up to "
        f"{search['max_concurrent_trials']} trials at once{length}",
        f"Trials: {search['ended']} ended, {search['running']} running, {search['queued']} "
        f"queued, {search['remaining']} remaining of {search['max_trials']}",
    ]
    best = search["best"]
    if best is None:
        return [*lines, "Best so far: none yet"]
    early = " (stopped early)" if best["early_stopped"] else ""
    return [*lines, f"Best so far: trial {best['trial_id']} (number {best['number']}){early}: "
                    f"{best['metric']} {number(best['value'])}",
            f"  hparams: {hparams_text(best['hparams'])}"]


def best_trial_lines(trial: api.TrialDetail) -> list[str]:
    """An experiment's best trial: its value, its hyperparameters, how it ended."""
    values = ", ".join(f"{name} {number(value)}"
                       for name, value in trial["best_validation"].items())
    return [f"Trial {trial['id']} (number {trial['number']}) of experiment "
            f"{trial['experiment_id']}: {values}",
            f"hparams: {hparams_text(trial['hparams'])}",
            f"state: {trial['state']}{_stopped_early(trial)}"]


def front_lines(front: api.ParetoFront) -> list[str]:
    """What a multi-objective search's Pareto front is made of, in words."""
    wanted = ", ".join(f"{o['name']} ({'smaller' if o['smaller_is_better'] else 'larger'} "
                       "is better)" for o in front["objectives"])
    lines = [f"Pareto front of experiment {front['experiment_id']}: "
             f"{count(front['front'], 'trial')} no other beats on every objective: {wanted}"]
    dominated = len(front["points"]) - front["front"]
    if dominated or front["without_values"]:
        lines.append(f"beaten: {count(dominated, 'trial')}; without a finite value of every "
                     f"objective: {count(front['without_values'], 'trial')}")
    return lines


def front_table(objectives: list[api.Objective], points: list[api.FrontPoint]) -> Table:
    """The trials of a Pareto front: each objective's value (as it ended), hparams."""
    names = [o["name"] for o in objectives]
    table = Table("Trial", "Number", *map(escape, names), "Hyperparameters")
    for point in points:
        table.add_row(str(point["trial_id"]), str(point["number"]),
                      *(number(point["values"][name]) for name in names),
                      escape(hparams_text(point["hparams"])))
    return table


def _stopped_early(trial: api.TrialDetail) -> str:
    stop = trial.get("early_stop")
    if stop:
        return f", stopped early by the searcher at step {stop['step']} (rung {stop['rung']})"
    return ", stopped early by the searcher" if trial["early_stopped"] else ""


def search_trials_table(trials: list[api.TrialSummary], sort: str | None) -> Table:
    """An experiment's trials: number, state, the best value of each metric, hparams."""
    names = list(dict.fromkeys([*([sort] if sort else []),
                                *(name for t in trials for name in t["best_validation"])]))
    table = Table("Trial", "Number", "State", "Verdict", "Early stopped", *map(escape, names),
                  "Hyperparameters")
    for trial in trials:
        values = trial["best_validation"]
        table.add_row(str(trial["id"]), str(trial["number"]), state(trial["state"]),
                      styled_verdict(trial), "yes" if trial["early_stopped"] else "-",
                      *(number(values[n]) if n in values else "-" for n in names),
                      escape(hparams_text(trial["hparams"])))
    return table


def hparams_text(hparams: api.Hparams) -> str:
    """Hyperparameters in one line, nested ones by their dotted path: `lr=0.01, opt.beta=0.9`."""
    return ", ".join(f"{path}={number(value) if isinstance(value, float) else value}"
                     for path, value in _flat(hparams, "")) or "-"


def _flat(tree: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def number(value: float | int | str) -> str:
    """A metric value for a table: 6 significant digits; "NaN"/"Infinity" stay words."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def size(n_bytes: int) -> str:
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def checkpoints_table(rows: list[api.CheckpointView]) -> Table:
    table = Table("Id", "Trial", "Step", "Size", "State", "Metric", "Validated at", "Storage",
                  "Why")
    for ckpt in rows:
        state = ckpt["state"] if ckpt["intact"] else f"{ckpt['state']}, [red]not intact[/]"
        metric = "-" if ckpt["metric"] is None else f"{ckpt['metric']:.6g}" if isinstance(
            ckpt["metric"], float | int) else str(ckpt["metric"])
        validated = "-" if ckpt.get("metric_step") is None else f"step {ckpt['metric_step']}"
        why = (ckpt["problem"] or ckpt["error"] or ckpt["deleted_because"]
               or ckpt["kept_because"] or "-")
        table.add_row(str(ckpt["id"]), str(ckpt["trial_id"]), str(ckpt["step"]),
                      size(ckpt["size"]), state, metric, validated,
                      escape(ckpt["storage_url"] or "-"), escape(why))
    return table


def gc_plan_table(plan: api.GcPlan) -> Table:
    policy = plan["policy"]
    title = (f"Checkpoint GC of experiment {plan['experiment_id']}: each trial's latest "
             f"{policy['save_trial_latest']} and best {policy['save_trial_best']}, the "
             f"experiment's best {policy['save_experiment_best']}"
             + (" (dry run: nothing changes)" if plan["dry_run"] else ""))
    table = Table("Id", "Trial", "Step", "State", "Plan", "Why", title=title)
    for c in plan["checkpoints"]:
        verdict = "keep" if c["keep"] else "[red]delete[/]"
        table.add_row(str(c["id"]), str(c["trial_id"]), str(c["step"]), c["state"], verdict,
                      escape("; ".join(c["reasons"])))
    return table


def manifest_line(manifest: api.JsonObject) -> str:
    """The data manifest in one line: files, bytes, classes, fingerprint."""
    classes = manifest.get("classes")
    shown = f", {len(classes)} classes" if classes else ""
    return (f"data: {manifest['file_count']:,} files, {manifest['total_bytes']:,} bytes{shown} "
            f"in {manifest['path']} (fingerprint {str(manifest['fingerprint'])[:12]})")


CHECK_STYLE = {"passed": "green", "failed": "red", "warning": "yellow", "not_run": "yellow"}


def verification_table(trial: api.TrialDetail, verification: api.JsonObject) -> Table:
    """The checks of the trial's exit 0 (its `verification`), each with its status, under its
    verdict line."""
    table = Table("Check", "Status", "Detail", title=f"Verification: {styled_verdict(trial)}")
    for check in verification["checks"]:
        status = check_status(check)
        table.add_row(escape(str(check["name"])),
                      f"[{CHECK_STYLE[status]}]{status.replace('_', ' ')}[/]",
                      escape(str(check["detail"])))
    return table


def events_table(events: list[api.Event]) -> Table:
    table = Table("Time", "Entity", "Move", "Reason", "Actor", "Message", title="Events")
    for event in events:
        move = (f"{event['from_state'] or '-'} → {event['to_state']}"
                if event["to_state"] else "-")
        entity = (f"attempt {event['attempt']}" if event.get("attempt") is not None
                  else f"{event['entity']} {event['entity_id']}")
        table.add_row(when(event["at"]), entity, move,
                      escape(event["reason"]), escape(event["actor"]),
                      escape(event["message"] or ""))
    return table


def importance_lines(answer: api.Importance) -> list[str]:
    """What an experiment's hyperparameter importance is of, and how it was computed."""
    better = "smaller" if answer["smaller_is_better"] else "larger"
    return [f"Experiment {answer['experiment_id']}: hyperparameter importance for "
            f"{answer['metric']} ({better} is better)",
            f"{answer['evaluator']} over {answer['trials_used']} trials with a value "
            f"({answer['ended_trials']} ended)"]


def importance_table(answer: api.Importance) -> Table:
    """The importances, the largest share first, each with a bar."""
    table = Table("Hyperparameter", "Importance", "")
    bar = 30  # characters for a share of 1
    for row in answer["importances"]:
        table.add_row(escape(row["name"]), f"{row['importance']:.3f}",
                      "█" * round(row["importance"] * bar))
    return table


# -- reproducibility snapshots and their diffs ---------------------------------------------

SHORT_HASH = 12  # hex digits of a hash shown to a person


def snapshot_lines(part: api.JsonObject) -> list[str]:
    """A snapshot's trial part in a few lines: code, seed, environment, data."""
    code, environment = part["code"], part["environment"]
    git = code.get("git")
    git_words = "no git state" if not git else (
        f"git {str(git['commit'])[:SHORT_HASH]}"
        + (f" on {git['branch']}" if git.get("branch") else "")
        + (" (dirty)" if git.get("dirty") else ""))
    packages = environment.get("packages")
    held = "packages not recorded" if packages is None else count(len(packages), "package")
    fingerprint = (part.get("data") or {}).get("fingerprint")
    seed = part.get("seed")
    return [
        f"  code: tree {str(code['tree_sha256'])[:SHORT_HASH]} ({count(code['files'], 'file')}), "
        f"{git_words}",
        f"  seed: {seed if seed is not None else 'none (no reproducibility.experiment_seed)'}",
        "  environment: " + (f"{environment['key']}, {held}" if environment.get("key")
                             else f"the base interpreter, {held}"),
        "  data: " + (f"fingerprint {str(fingerprint)[:SHORT_HASH]}" if fingerprint
                      else "no data manifest"),
    ]


def warm_start_line(source: api.WarmStartView) -> str:
    """Where an experiment's trials start from: `checkpoint step-… (step 5) of trial 3
    (experiment 1, model m v1), named by source_model: m@1`."""
    model = (f", model {source['model']} v{source['version']}"
             if source["model"] is not None else "")
    return (f"checkpoint {source['checkpoint']} (step {source['step']}) of trial "
            f"{source['trial_id']} (experiment {source['experiment_id']}{model}), named by "
            f"{source['named']}")


def lineage_line(lineage: api.TrialLineage) -> str:
    """A PBT trial's lineage: `generation 2, exploit: copied trial 7's checkpoint step-… (step
    20), replacing trial 9; lr 0.01 -> 0.012`."""
    head = f"generation {lineage['generation']}"
    if lineage["parent_trial_id"] is None:
        return f"{head}, drawn afresh (population-based training)"
    checkpoint = (f"checkpoint {lineage['checkpoint']} (step {lineage['step']})"
                  if lineage["checkpoint"] is not None else "its checkpoint")
    if lineage["action"] == "continue":
        return (f"{head}, continue: goes on from trial {lineage['parent_trial_id']}'s "
                f"{checkpoint} with the same hyperparameters")
    changed = "; ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in
                        lineage["changed"].items()) or "no value changed"
    return (f"{head}, exploit: copied trial {lineage['parent_trial_id']}'s {checkpoint}, "
            f"replacing trial {lineage['replaces_trial_id']}; explored: {changed}")


def diff_lines(found: api.TrialDiff) -> list[str]:
    """A snapshot diff (`differences` and their `lines`) as `muster trial diff` prints it:
    each group's name, then its lines, most result-relevant first."""
    shown: list[str] = []
    pairs = zip(found["differences"], found["lines"], strict=True)
    for group, rows in groupby(pairs, key=lambda pair: pair[0]["group"]):
        shown.append(f"{group}:")
        shown += [f"  {line}" for _, line in rows]
    return shown


BASIS_WORDS = {"best": "its best trial by the searcher's metric", "latest": "its latest trial"}


def stand_in_lines(found: api.ExperimentDiff, a: int, b: int) -> list[str]:
    """Which trial stood for each experiment of an experiment diff, and why."""
    return [f"experiment {a}: trial {found['a_trial']}, {BASIS_WORDS[found['a_basis']]}",
            f"experiment {b}: trial {found['b_trial']}, {BASIS_WORDS[found['b_basis']]}"]


def artifact_lines(found: api.ArtifactSetView) -> list[str]:
    """A trial's artifact set: a line for the set, one per file (size, sha256, path), and
    one per file it left (with why)."""
    head = (f"artifacts of trial {found['trial_id']} (attempt {found['attempt']}): "
            f"{found['state']}")
    if found["files"]:
        head += f", {count(len(found['files']), 'file')}, {format_size(found['size'])}"
    if found["message"]:
        head += f": {found['message']}"
    lines = [head]
    lines += [f"  {format_size(f['size']):>10}  {f['sha256'][:12]}  {f['path']}"
              for f in found["files"]]
    lines += [f"  left: {why}" for why in found["skipped"]]
    if found["skipped_count"] > len(found["skipped"]):
        lines.append(f"  and {found['skipped_count'] - len(found['skipped'])} more left")
    return lines


def confirmed(question: str) -> bool:
    """The person's yes; no when there is nobody to ask (stdin closed)."""
    try:
        return typer.confirm(question, default=False)
    except typer.Abort:
        return False
