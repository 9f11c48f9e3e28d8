"""`muster trial ...` (alias `muster t`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from muster.cli import follow as following
from muster.cli import log_grep, render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client, stopped_following
from muster.errors import Forbidden, InvalidRequest, MusterError
from muster.states import MetricKind, TrialState
from muster.words import progress_line

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="Describe trials, read their logs and metrics, dump their stacks, "
                  "review them; kill, pause, activate or restart one.", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)
DEFAULT_TAIL = 50
DONE = {"approve": "approved", "reject": "rejected"}
GREP_NO_MATCH, GREP_ERROR = 1, 2  # `logs --grep`'s exit statuses, as grep's


KindOption = Annotated[MetricKind | None, typer.Option(
    help="only this kind (default: training and validation; system: the replicas' resource "
    "samples)")]


@app.command("list")
def list_(
    experiment_id: int,
    sort: Annotated[str | None, typer.Option(
        help="order by this validation metric: the searcher's best first, any other smallest "
        "first; trials without it last")] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List an experiment's trials: state, whether the searcher stopped them early, their
    best validation value and their hyperparameters."""
    with client(home, url) as c:
        trials = c.list_trials(experiment_id, sort=sort)
    if as_json:
        render.print_json(trials)
    elif not trials:
        render.err_console.print(f"experiment {experiment_id} has no trials yet")
    else:
        render.console.print(render.search_trials_table(trials, sort))


@app.command()
def describe(
    trial_id: int, as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Show a trial: its attempts, how each replica ended, each replica's resources (CPU,
    memory, GPUs: latest and peak), and its event history."""
    with client(home, url) as c:
        trial = c.get_trial(trial_id)
    if as_json:
        render.print_json(trial)
        return
    render.console.print(f"Trial {trial['id']} (experiment {trial['experiment_id']}): "
                         f"{render.state(trial['state'])}  restarts: {trial['restarts']}")
    render.console.print(f"verdict: {render.styled_verdict(trial)}", soft_wrap=True)
    if trial["message"]:
        render.console.print(trial["message"], markup=False)
    if integration := trial.get("integration"):
        render.console.print(f"connected through: {_CONNECTED.get(integration, integration)}",
                             markup=False)
    lineage = trial.get("lineage")
    if (source := trial.get("source")) and (lineage is None or lineage["parent_trial_id"] is None):
        render.console.print(f"warm start: {render.warm_start_line(source)}", markup=False)
    if lineage is not None:
        render.console.print(f"lineage: {render.lineage_line(lineage)}", markup=False)
    if progress := trial.get("progress"):
        render.console.print(f"progress: {progress_line(progress)}", markup=False)
    render.console.print(render.attempts_table(trial))
    for line in render.ended_replicas(trial):
        render.console.print(f"  {line}", markup=False)
    if resources := trial.get("resources"):
        render.console.print(render.resources_table(resources))
    if stacks := render.stack_lines(trial):
        render.console.print(f"stacks (`muster trial evidence {trial['id']} --attempt N DIR` "
                             "downloads the bundles):", markup=False)
        for line in stacks:
            render.console.print(f"  {line}", markup=False, soft_wrap=True)
    if manifest := trial.get("manifest"):
        render.console.print(render.manifest_line(manifest), markup=False)
    if verification := trial.get("verification"):
        render.console.print(render.verification_table(trial, verification))
    if trial.get("queue_reason"):
        waiting = "queued" if trial["state"] == TrialState.QUEUED else "waiting"
        render.console.print(f"{waiting}: {trial['queue_reason']}", markup=False)
    _environment(trial, home, url)
    if snapshot := trial.get("snapshot"):
        render.console.print(f"snapshot (`muster trial diff {trial['id']} OTHER` compares "
                             "two):", markup=False)
        for line in render.snapshot_lines(snapshot):
            render.console.print(line, markup=False)
    render.console.print(render.events_table(trial.get("events", [])))


_BUILD_LOG_LINES = 15
_CONNECTED = {"harness": "muster.harness (the script's own calls)"}


def _environment(trial: api.TrialDescription, home: str | None, url: str | None) -> None:
    """Which environment the trial runs in; while it is built, or when its build failed
    the trial, the end of the build's log."""
    env = trial.get("environment") or {}
    key = env.get("hash")
    python = env.get("python") or "the server's own"
    if key is None:
        render.console.print(f"environment: {python} interpreter, under the trial's own "
                             "layer", markup=False)
        return
    frozen = env.get("freeze")
    render.console.print(f"environment: {key}" + (f" ({len(frozen)} packages frozen)"
                                                   if frozen else ""), markup=False)
    building = trial["state"] == TrialState.QUEUED and "building environment" in (
        trial.get("queue_reason") or "")
    if not building and key not in (trial.get("message") or ""):
        return
    with client(home, url) as c:
        try:
            _key, data = c.environment_log(key)
        except Forbidden as exc:  # a build log is its owners' and admins'
            render.console.print(f"its build log: {exc}", markup=False)
            return
    lines = data.decode("utf-8", errors="replace").splitlines()[-_BUILD_LOG_LINES:]
    render.console.print(f"its build log, last {len(lines)} lines (`muster env logs {key}`):",
                         markup=False)
    for line in lines:
        render.console.print(f"  {line}", markup=False)


@app.command()
def diff(
    a: int, b: int, as_json: JsonOption = False, home: HomeOption = None,
    url: UrlOption = None,
) -> None:
    """What differs between two trials: code, config and hyperparameters, packages,
    framework and library versions (the CUDA libraries each rank loaded), numerics switches
    and variables, hardware; most result-relevant first, hostnames and paths left out. A
    script without the harness is compared by what the server saw of it from outside, at
    each attempt's launch: its interpreter and its layer's packages ("seen from
    outside")."""
    with client(home, url) as c:
        found = c.diff_trials(a, b)
    if as_json:
        render.print_json({"differences": found["differences"]})
        return
    if not found["differences"]:
        render.console.print(f"trials {a} and {b}: no difference in what they were made of",
                             markup=False)
    for line in render.diff_lines(found):
        render.console.print(line, markup=False)


@app.command()
def logs(
    trial_id: int,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="stream until the trial ends; exit 0 only if it SUCCEEDED")]
    = False,
    require_verified: Annotated[bool, typer.Option(
        "--require-verified", help="with --follow: exit 3 when the trial SUCCEEDED but its "
        "exit 0 was not verified")] = False,
    tail: Annotated[int | None, typer.Option(help="only the last N lines (of the latest "
                                             "attempt)")] = None,
    attempt: Annotated[int | None, typer.Option(
        help="only this attempt (default: every attempt, in order)")] = None,
    # A backslash before "[rank r]" keeps Rich from reading it as markup (also in the docstring).
    rank: Annotated[int | None, typer.Option(
        min=0, help="only this replica's log, as written (default: every rank, merged in "
        "time order, each line prefixed '\\[rank r] '; a single-replica trial's log as is)",
    )] = None,
    grep: Annotated[str | None, typer.Option(
        metavar="PATTERN", help="print only the lines that hold PATTERN, searched on the "
        "server over the whole log (each attempt, each rank); exit 1 when none does")] = None,
    regex: Annotated[bool, typer.Option(
        "--regex/--fixed", help="with --grep: PATTERN is an RE2 regular expression "
        "(default: --fixed, the text as it is)")] = False,
    ignore_case: Annotated[bool, typer.Option(
        "--ignore-case", "-i", help="with --grep: upper and lower case match alike")] = False,
    max_count: Annotated[int | None, typer.Option(
        "--max-count", "-m", min=1, help="with --grep: stop after N lines")] = None,
    byte_offset: Annotated[bool, typer.Option(
        "--byte-offset", "-b", help="with --grep: print each line's byte offset in its "
        "rank's log before it")] = False,
    home: HomeOption = None, url: UrlOption = None,
) -> None:
    r"""Write the trial's log to stdout (decoded as UTF-8 with replacement), nothing else.

    Every attempt in order, with a line between two attempts that says why the next one
    started (on stderr when stdout is not a terminal); --attempt N shows one attempt. Without
    --rank, the ranks of a multi-replica trial are merged in time order, whole lines each
    prefixed '\[rank r] '; --rank R shows one rank's log exactly as it was written.

    --grep PATTERN prints only the matching lines (a line longer than 4 KiB cut around its
    match), each attempt's and rank's prefixed 'attempt N rank R:' when there are several;
    exit 0 when a line matched, 1 when none did, 2 on an error, as grep's.
    """
    if grep is not None:
        _grep(trial_id, log_grep.GrepRequest(grep, regex, ignore_case, attempt, rank,
                                             max_count, byte_offset),
              follow or tail is not None, home, url)
    output = following.Output()
    with client(home, url) as c:
        trial = c.get_trial(trial_id)
        _check_rank(trial, rank)
        if not follow:
            following.print_trial_logs(c, trial_id, _write, output, attempt=attempt,
                                       rank=rank, tail=tail)
            return
        with stopped_following(f"trial {trial_id}", trial["experiment_id"]):
            trial = following.follow_trial(c, trial_id, _write, output, attempt=attempt,
                                           rank=rank, tail=tail)
    if trial["state"] != TrialState.SUCCEEDED:
        render.err_console.print(f"trial {trial_id} is {trial['state']}: "
                                 f"{render.styled_verdict(trial)}", soft_wrap=True)
        raise typer.Exit(following.NOT_SUCCEEDED)
    if require_verified and render.verified(trial) is not True:
        render.err_console.print(f"trial {trial_id}: {render.styled_verdict(trial)} "
                                 "(--require-verified)", soft_wrap=True)
        raise typer.Exit(following.NOT_VERIFIED)


def _grep(trial_id: int, request: log_grep.GrepRequest, reads_live: bool,
          home: str | None, url: str | None) -> NoReturn:
    """`logs --grep`: print the matching lines; exit as grep does (0, 1, 2 on an error)."""
    try:
        if reads_live:
            raise InvalidRequest("--grep searches the whole log as it is: leave out --follow "
                                 "and --tail (use --max-count N to print fewer lines)")
        with client(home, url) as c:
            printed = log_grep.grep_trial_logs(c, trial_id, request, _write)
    except MusterError as exc:
        render.err_console.print(f"error: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(GREP_ERROR) from None
    raise typer.Exit(0 if printed else GREP_NO_MATCH)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _check_rank(trial: api.TrialDescription, rank: int | None) -> None:
    """Refuse a rank the trial does not have, naming the ones it has."""
    ranks = sorted({r["rank"] for a in trial["attempts"] for r in a["replicas"]})
    if rank is not None and ranks and rank not in ranks:
        shown = ", ".join(map(str, ranks))
        raise InvalidRequest(f"trial {trial['id']} has no rank {rank}; its ranks are {shown}")


@app.command()
def metrics(
    trial_id: int,
    kind: KindOption = None,
    tail: Annotated[int | None, typer.Option(
        min=1, help=f"only the last N reports (table default {DEFAULT_TAIL})")] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Show the trial's reported metrics: one row per report, one column per metric.

    `--json` prints every report (or the last `--tail N`), with NaN and ±Infinity as the
    strings "NaN", "Infinity" and "-Infinity".
    """
    kind_name = kind.value if kind else None
    with client(home, url) as c:
        if as_json and tail is None:
            reports = c.all_metrics(trial_id, kind=kind_name)
        else:
            reports = c.get_metrics(trial_id, kind=kind_name, tail=tail or DEFAULT_TAIL)
    if as_json:
        render.print_json(reports)
    elif not reports:
        render.err_console.print(f"trial {trial_id} has reported no metrics yet")
    else:
        render.console.print(render.metrics_table(reports))


@app.command()
def dump(
    trial_id: int, as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Save an evidence bundle of a RUNNING trial now, as muster does before it stops a
    stalled replica: every thread's stack of every Python process of each running replica
    (py-spy), its processes' state, CPU and memory, the end of its log. Prints where each
    rank's main thread is, and where the bundle is; exits 1 when no rank's part came."""
    with client(home, url) as c:
        result = c.dump_trial(trial_id)
    if as_json:
        render.print_json(result)
    else:
        for part in result["ranks"]:
            render.console.print(part["line"], markup=False, soft_wrap=True)
            for error in part["errors"]:
                render.err_console.print(f"  rank {part['rank']}: {error}", markup=False,
                                         soft_wrap=True)
        render.console.print(
            f"bundle {result['bundle']} (attempt {result['attempt']}): {result['path']} on the "
            f"server; `muster trial evidence {trial_id} --attempt {result['attempt']} DIR` "
            "downloads it", markup=False, soft_wrap=True)
    if not any(part["complete"] for part in result["ranks"]):
        raise typer.Exit(1)


@app.command()
def artifacts(
    trial_id: int,
    download: Annotated[Path | None, typer.Option(
        "--download", metavar="DIR",
        help="download every file into DIR (new or empty), each sha256 checked")] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """The files the trial's final attempt left that its config names (`artifacts`,
    `verify.outputs`), as the server copied them when the trial ended: each with its size
    and sha256, and the matching files it left, with why."""
    with client(home, url) as c:
        found = (c.get_artifacts(trial_id) if download is None
                 else c.download_artifacts(trial_id, download))
    if as_json:
        render.print_json(found)
        return
    for line in render.artifact_lines(found):
        render.console.print(line, markup=False, soft_wrap=True)
    if download is not None:
        render.console.print(f"downloaded to {download}", markup=False, soft_wrap=True)


@app.command()
def evidence(
    trial_id: int,
    directory: Annotated[Path, typer.Argument(help="where to unpack them, new or empty")],
    attempt: Annotated[int | None, typer.Option(
        min=1, help="the attempt (default: the latest that has evidence)")] = None,
    home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Download the evidence bundles of one attempt of a trial into DIRECTORY:
    `<bundle>/rank-<r>/` with summary.json, stacks.txt (every thread of every Python
    process), stacks.json, processes.json, log-tail.txt and flight-recorder/."""
    with client(home, url) as c:
        c.download_evidence(trial_id, directory, attempt)
    bundles = sorted(p.name for p in directory.iterdir() if p.is_dir())
    render.console.print(f"evidence of trial {trial_id} in {directory}: "
                         f"{', '.join(bundles)}", markup=False)


@app.command()
def review(
    trial_id: int,
    note: Annotated[str, typer.Option(help="why; recorded with the decision")],
    approve: Annotated[bool, typer.Option("--approve", help="the trial SUCCEEDED")] = False,
    reject: Annotated[bool, typer.Option("--reject", help="the trial FAILED")] = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Resolve a SUSPECT trial (exit 0, a verification failed): --approve or --reject it.
    The review is recorded as yours (the muster user of your token)."""
    if approve == reject:
        raise typer.BadParameter("give exactly one of --approve and --reject")
    decision = "approve" if approve else "reject"
    with client(home, url) as c:
        trial = c.review_trial(trial_id, decision, note)
    if as_json:
        render.print_json(trial)
        return
    render.console.print(f"trial {trial_id} {DONE[decision]}: {render.state(trial['state'])}")



# -- one trial's controls (the rest of its experiment goes on) -----------------------------


def _controlled(trial: api.TrialDescription, as_json: bool, under_way: str) -> None:
    """What a control did: the trial's state now, and what happens next while it stops."""
    if as_json:
        render.print_json(trial)
        return
    state = trial["state"]
    render.console.print(f"trial {trial['id']}: {render.state(state)}"
                         + ("" if TrialState(state).is_at_rest() or state in (
                             TrialState.PAUSED, TrialState.QUEUED) else f"; {under_way}"))


@app.command()
def kill(trial_id: int, as_json: JsonOption = False, home: HomeOption = None,
         url: UrlOption = None) -> None:
    """Stop one trial for good: it ends CANCELED (SIGTERM, grace period, SIGKILL while it
    runs). The rest of its experiment goes on; a search draws its other trials."""
    with client(home, url) as c:
        trial = c.kill_trial(trial_id)
    _controlled(trial, as_json, "kill requested: SIGTERM, then SIGKILL after the grace period")


@app.command()
def pause(trial_id: int, as_json: JsonOption = False, home: HomeOption = None,
          url: UrlOption = None) -> None:
    """Pause one trial: it gets SIGTERM (it can checkpoint), frees its slots and GPUs and
    waits PAUSED until `muster trial activate`; its experiment stays ACTIVE."""
    with client(home, url) as c:
        trial = c.pause_trial(trial_id)
    _controlled(trial, as_json, "pausing: it stops at its next checkpoint or after the grace "
                                "period, then waits PAUSED")


@app.command()
def activate(trial_id: int, as_json: JsonOption = False, home: HomeOption = None,
             url: UrlOption = None) -> None:
    """Queue a paused trial again: it resumes from its latest checkpoint."""
    with client(home, url) as c:
        trial = c.activate_trial(trial_id)
    _controlled(trial, as_json, "it goes back to the queue as soon as it has stopped")


@app.command()
def restart(trial_id: int, as_json: JsonOption = False, home: HomeOption = None,
            url: UrlOption = None) -> None:
    """Stop a running trial and queue it again at once: it resumes from its latest
    checkpoint; no failure and no restart budget are counted."""
    with client(home, url) as c:
        trial = c.restart_trial(trial_id)
    _controlled(trial, as_json, "restarting: it stops at its next checkpoint or after the "
                                "grace period, then goes back to the queue")
