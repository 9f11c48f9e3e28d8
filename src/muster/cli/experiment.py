"""`muster experiment ...` (alias `muster e`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from muster.cli import follow as following
from muster.cli import render
from muster.cli.configs import print_translation
from muster.cli.options import HomeOption, JsonOption, UrlOption, client, stopped_following
from muster.errors import InvalidRequest
from muster.states import ExperimentState, TrialState

if TYPE_CHECKING:
    from muster import api
    from muster.client import Client
    from muster.config import ExperimentConfig

app = typer.Typer(help="Create, list, describe and kill experiments.", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)

RequireVerifiedOption = Annotated[bool, typer.Option(
    "--require-verified", help="with --follow or --wait: exit 3 when the experiment "
    "succeeded but a SUCCEEDED trial's exit 0 was not verified (see its verdict)")]


@app.command()
def create(
    config: Annotated[Path, typer.Argument(help="experiment config (YAML)")],
    context_dir: Annotated[Path | None, typer.Argument(
        help="directory snapshotted as the trial's working directory "
             "(default: the config's directory)")] = None,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="stream the logs (a search: every trial's, prefixed "
        "'[trial N] '); exit 0 only if the experiment COMPLETED and every trial SUCCEEDED"
    )] = False,
    wait: Annotated[bool, typer.Option(
        help="wait for the end; exit 0 only if the experiment COMPLETED and every trial "
        "SUCCEEDED")] = False,
    secret: Annotated[list[str] | None, typer.Option(
        "--secret", metavar="NAME=VALUE", help="the value of a `submit` secret of the config "
        "(environment.secrets); without one, it is read from your environment variable NAME"
    )] = None,
    context_from: Annotated[int | None, typer.Option(
        "--context-from", metavar="ID", help="run again: reuse experiment ID's context "
        "snapshot instead of uploading a directory")] = None,
    require_verified: RequireVerifiedOption = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Submit an experiment: validate the config, upload the context, queue its trial.

    With --follow or --wait it ends with each trial's verdict (verified, not verified and
    why, SUSPECT and why) and exits 0 only if the experiment COMPLETED and every trial
    SUCCEEDED, else 1; with --require-verified, 3 if a SUCCEEDED trial was not verified."""
    from muster.config.loading import read_experiment_config_file  # pydantic: only here

    loaded = read_experiment_config_file(config)  # fail fast, as the server would
    if loaded.translation is not None:
        print_translation(str(config), loaded.translation)
    values = _secret_values(loaded.config, secret or [])
    if context_from is not None and context_dir is not None:
        raise InvalidRequest("give a context directory or --context-from, not both")
    with client(home, url) as c:
        exp = c.create_experiment(
            config.read_text(), None if context_from is not None else (
                context_dir or config.parent), values, context_from=context_from)
        if not as_json:
            render.err_console.print(f"created experiment {exp['id']} ({exp['name']})")
        if follow or wait:
            with stopped_following(f"experiment {exp['id']}", exp["id"]):
                exp = _follow(c, exp, home, url) if follow else c.wait_experiment(exp["id"])
    _report_created(exp, as_json, follow or wait)
    if follow or wait:
        _exit_as([exp], require_verified)


@app.command("create-batch")
def create_batch(
    configs: Annotated[list[Path], typer.Argument(help="experiment configs (YAML)")],
    context_dir: Annotated[Path | None, typer.Option(
        "--context", help="directory snapshotted as every trial's working directory "
        "(default: the first config's directory)")] = None,
    wait: Annotated[bool, typer.Option(
        help="wait for every experiment's end; exit 0 only if each COMPLETED and every "
        "trial SUCCEEDED")] = False,
    secret: Annotated[list[str] | None, typer.Option(
        "--secret", metavar="NAME=VALUE", help="the value of a `submit` secret of the "
        "configs; without one, it is read from your environment variable NAME")] = None,
    require_verified: RequireVerifiedOption = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Submit several experiments sharing one context: it is packed and uploaded once, and
    each request's experiments are created together (all or none)."""
    from muster.config.loading import read_experiment_config_file

    loaded = [read_experiment_config_file(config) for config in configs]  # all before uploading
    values: dict[str, str] = {}
    for path, one in zip(configs, loaded, strict=True):
        if one.translation is not None:
            print_translation(str(path), one.translation)
        values |= _secret_values(one.config, secret or [])
    with client(home, url) as c:
        created = c.create_experiments([config.read_text() for config in configs],
                                       context_dir or configs[0].parent, values)
        if not as_json:
            render.err_console.print(
                f"created experiments {', '.join(str(exp['id']) for exp in created)}")
        if wait:
            ids = ", ".join(str(exp["id"]) for exp in created)
            with stopped_following(f"each of experiments {ids}", created[0]["id"]):
                created = [c.wait_experiment(exp["id"]) for exp in created]
    if as_json:
        render.print_json(created)
    else:
        for exp in created:
            _report_created(exp, False, wait)
    if wait:
        _exit_as(created, require_verified)


def _exit_as(ended: list[api.ExperimentDetail], require_verified: bool) -> None:
    """Exit as `--follow`/`--wait` promise (`following.exit_code`); return on 0."""
    code = following.exit_code(ended, require_verified)
    if code == following.NOT_VERIFIED:
        render.err_console.print("not every SUCCEEDED trial was verified (--require-verified)",
                                 markup=False)
    if code:
        raise typer.Exit(code)


def _secret_values(config: ExperimentConfig, given: list[str]) -> dict[str, str]:
    """The values of the config's `submit` secrets: `--secret NAME=VALUE`, else $NAME."""
    from muster.config.secrets import source_of

    wanted = [name for name, text in config.environment.secrets.items()
              if source_of(text).kind == "submit"]
    values: dict[str, str] = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidRequest(f"--secret {item!r}: write NAME=VALUE")
        if name not in wanted:
            raise InvalidRequest(f"--secret {name}: the config declares no such `submit` "
                                 f"secret (environment.secrets: {', '.join(wanted) or 'none'})")
        values[name] = value
    for name in wanted:
        if name not in values:
            if name not in os.environ:
                raise InvalidRequest(f"secret {name}: set it in your environment (export "
                                     f"{name}=...) or pass --secret {name}=VALUE")
            values[name] = os.environ[name]
    return values


def _follow(c: Client, exp: api.ExperimentDetail, home: str | None, url: str | None
            ) -> api.ExperimentDetail:
    """Stream the experiment's logs until it is at rest: its one trial's as written, or
    a search's trial by trial."""
    output = following.Output()
    if (exp.get("search") or {}).get("searcher", "single") == "single" and exp["trials"]:
        following.follow_trial(c, exp["trials"][0]["id"], _write_stdout, output)
        return c.wait_experiment(exp["id"])
    return following.follow_experiment(c, exp, output, lambda: client(home, url))


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _report_created(exp: api.ExperimentDetail, as_json: bool, ended: bool) -> None:
    if as_json:
        render.print_json(exp)
    elif ended:
        verb = "ended" if ExperimentState(exp["state"]).is_terminal() else "is"
        render.err_console.print(f"experiment {exp['id']} {verb} {render.state(exp['state'])}: "
                                 f"{render.verdict_counts(exp).words()}")
        for trial in exp["trials"]:
            render.err_console.print(f"  trial {trial['id']}: {render.styled_verdict(trial)}",
                                     soft_wrap=True)  # one line, however long
            for line in render.ended_replicas(trial):
                render.err_console.print(f"  trial {trial['id']} {line}", markup=False)
            if trial["state"] == TrialState.SUSPECT:
                render.err_console.print(
                    f"  trial {trial['id']} is SUSPECT: {trial['message']}\n"
                    f"  resolve it with `muster trial review {trial['id']} --approve|--reject "
                    "--note TEXT`", markup=False)


@app.command("list")
def list_(
    mine: Annotated[bool, typer.Option("--mine", help="only yours")] = False,
    owner: Annotated[str | None, typer.Option(help="only this user's")] = None,
    state: Annotated[str | None, typer.Option(help="only those in this state")] = None,
    label: Annotated[str | None, typer.Option(help="only those with this label")] = None,
    name: Annotated[str | None, typer.Option(help="only those whose name holds this")] = None,
    last: Annotated[int | None, typer.Option(help="only the N newest")] = None,
    archived: Annotated[bool, typer.Option("--archived", help="archived ones too")] = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List experiments (every user's, or --mine, or --owner NAME's), oldest first;
    archived ones only with --archived."""
    with client(home, url) as c:
        rows = c.list_experiments(owner=owner, mine=mine, state=state, label=label, name=name,
                                  descending=last is not None, limit=last, archived=archived)
    if last is not None:
        rows.reverse()
    render.print_json(rows) if as_json else render.console.print(render.experiments_table(rows))


@app.command()
def describe(
    experiment_id: int,
    trials_offset: Annotated[int | None, typer.Option(
        min=0, help="show its trials from this one (by id, from 0)")] = None,
    trials_limit: Annotated[int | None, typer.Option(
        min=1, max=1000, help="show at most this many trials (default and most: 1,000)")
    ] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Show an experiment, its trials and how every process ended: 1,000 trials at a time
    (--trials-offset, --trials-limit)."""
    with client(home, url) as c:
        exp = c.get_experiment(experiment_id, offset=trials_offset, limit=trials_limit)
    if as_json:
        render.print_json(exp)
        return
    render.console.print(f"Experiment {exp['id']} [bold]{escape(exp['name'])}[/]: "
                         f"{render.state(exp['state'])}; trials: "
                         f"{render.verdict_counts(exp).words()}")
    if exp.get("message"):
        render.console.print(f"  {exp['message']}", markup=False)
    for warning in exp.get("warnings", []):
        render.console.print(f"[yellow]warning:[/] {escape(warning)}")
    if source := exp.get("source"):
        render.console.print(f"warm start: {render.warm_start_line(source)}", markup=False)
    search = exp.get("search")
    if search and search["searcher"] != "single":
        for line in render.search_lines(search):
            render.console.print(line, markup=False)
    render.console.print(render.trials_table(exp["trials"]))
    for trial in exp["trials"]:
        if trial["attempts"]:
            render.console.print(f"Trial {trial['id']}")
            render.console.print(render.attempts_table(trial))
            for line in render.ended_replicas(trial):
                render.console.print(f"  {line}", markup=False)
    if paging := render.trials_page_line(exp):
        render.console.print(paging, markup=False)


@app.command()
def best(
    experiment_id: int, as_json: JsonOption = False, home: HomeOption = None,
    url: UrlOption = None,
) -> None:
    """Show the best trial so far: the SUCCEEDED one (stopped early or not) with the best
    value of the searcher's metric, and its hyperparameters; for a search of several
    objectives (`searcher.metrics`), its Pareto front: the trials no other beats on all."""
    with client(home, url) as c:
        objectives = c.get_experiment(experiment_id, limit=1)["search"]["objectives"]
        if len(objectives) > 1:
            front = c.pareto_front(experiment_id)
        else:
            trial = c.best_trial(experiment_id)
    if len(objectives) > 1:
        on_front = [point for point in front["points"] if point["on_front"]]
        if as_json:
            render.print_json(on_front)
            return
        for line in render.front_lines(front):
            render.console.print(line, markup=False)
        render.console.print(render.front_table(front["objectives"], on_front))
        return
    if as_json:
        render.print_json(trial)
        return
    for line in render.best_trial_lines(trial):
        render.console.print(line, markup=False)


@app.command()
def importance(
    experiment_id: int, as_json: JsonOption = False, home: HomeOption = None,
    url: UrlOption = None,
) -> None:
    """Show how much each hyperparameter the search varied mattered for the searcher's
    metric (Optuna's PED-ANOVA over the SUCCEEDED trials with a value)."""
    with client(home, url) as c:
        answer = c.experiment_importance(experiment_id)
    if as_json:
        render.print_json(answer)
        return
    for line in render.importance_lines(answer):
        render.console.print(line, markup=False)
    render.console.print(render.importance_table(answer))
    if answer["message"]:
        render.console.print(f"note: {answer['message']}", markup=False)


@app.command()
def diff(
    a: int, b: int, as_json: JsonOption = False, home: HomeOption = None,
    url: UrlOption = None,
) -> None:
    """What differs between two experiments, as `muster trial diff` of one trial each: its
    best by the searcher's metric, else its latest (both named first)."""
    with client(home, url) as c:
        found = c.diff_experiments(a, b)
    if as_json:
        render.print_json(found)
        return
    for line in render.stand_in_lines(found, a, b):
        render.console.print(line, markup=False)
    if not found["differences"]:
        render.console.print(f"experiments {a} and {b}: no difference in what they were made "
                             "of", markup=False)
    for line in render.diff_lines(found):
        render.console.print(line, markup=False)


@app.command()
def delete(
    experiment_id: int,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")
                   ] = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Delete an ended experiment for good: its checkpoints (in storage too), run
    directories, logs and records. Asks first unless --yes."""
    if not yes and not render.confirmed(f"Delete experiment {experiment_id} with its checkpoints, "
                                  "logs and records? This cannot be undone"):
        render.console.print("nothing was deleted (--yes deletes without asking)",
                             markup=False)
        raise typer.Exit(1)
    with client(home, url) as c:
        answer = c.delete_experiment(experiment_id)
    render.print_json(answer) if as_json else render.console.print(answer["message"],
                                                                     markup=False)


@app.command()
def archive(experiment_id: int, home: HomeOption = None, url: UrlOption = None) -> None:
    """Hide an experiment from the default lists (`list --archived` shows it); nothing is
    removed."""
    with client(home, url) as c:
        c.archive_experiment(experiment_id, True)
    render.console.print(f"experiment {experiment_id} is archived", markup=False)


@app.command()
def unarchive(experiment_id: int, home: HomeOption = None, url: UrlOption = None) -> None:
    """Show an archived experiment in the default lists again."""
    with client(home, url) as c:
        c.archive_experiment(experiment_id, False)
    render.console.print(f"experiment {experiment_id} is no longer archived", markup=False)


@app.command()
def kill(
    experiment_id: int, as_json: JsonOption = False, home: HomeOption = None,
    url: UrlOption = None,
) -> None:
    """Stop every trial of an experiment (SIGTERM, grace period, SIGKILL)."""
    with client(home, url) as c:
        exp = c.kill_experiment(experiment_id)
    if as_json:
        render.print_json(exp)
    else:
        render.console.print(f"experiment {experiment_id}: kill requested; "
                             "running trials get SIGTERM, then SIGKILL after the grace period")


@app.command()
def pause(
    experiment_id: int, as_json: JsonOption = False, home: HomeOption = None,
    url: UrlOption = None,
) -> None:
    """Pause an experiment: running trials get SIGTERM (they can checkpoint), free their
    resources and wait PAUSED; `muster experiment activate` resumes them."""
    with client(home, url) as c:
        exp = c.pause_experiment(experiment_id)
    if as_json:
        render.print_json(exp)
    else:
        render.console.print(f"experiment {experiment_id}: pausing; running trials get "
                             "SIGTERM and stop at their next checkpoint or after the grace "
                             "period")


@app.command()
def activate(
    experiment_id: int, as_json: JsonOption = False, home: HomeOption = None,
    url: UrlOption = None,
) -> None:
    """Resume a paused experiment: its trials go back to the queue and resume from their
    latest checkpoints."""
    with client(home, url) as c:
        exp = c.activate_experiment(experiment_id)
    if as_json:
        render.print_json(exp)
    else:
        render.console.print(f"experiment {experiment_id}: active; its paused trials are "
                             "back in the queue")


@app.command()
def watch(experiment_id: int,
          require_verified: Annotated[bool, typer.Option(
              "--require-verified", help="exit 3 when it COMPLETED but a SUCCEEDED trial's "
              "exit 0 was not verified")] = False,
          home: HomeOption = None, url: UrlOption = None) -> None:
    """Follow an experiment's search until it ends: trials by stage and by verdict, the
    best so far, the newest trials (a line per change when not on a terminal). Exits 0
    only if it ends COMPLETED (with --require-verified: and every SUCCEEDED trial was
    verified, else 3)."""
    from muster.cli import watch as watching  # the module, beside this command of its name

    with client(home, url) as c:
        exp = watching.watch(c, experiment_id)
    counts = render.verdict_counts(exp).words()
    if exp["state"] == ExperimentState.COMPLETED:
        render.err_console.print(f"experiment {experiment_id} ended "
                                 f"{render.state('COMPLETED')}: {counts}")
        if require_verified and not following.all_verified(exp):
            render.err_console.print("not every SUCCEEDED trial was verified "
                                     "(--require-verified)", markup=False)
            raise typer.Exit(following.NOT_VERIFIED)
        return
    held = "" if exp["state"] != ExperimentState.ACTIVE else (
        ": its SUSPECT trials wait for `muster trial review ID --approve|--reject --note TEXT`")
    verb = "ended" if ExperimentState(exp["state"]).is_terminal() else "is"
    render.err_console.print(f"experiment {experiment_id} {verb} "
                             f"{render.state(exp['state'])}{held}; {counts}")
    raise typer.Exit(following.NOT_SUCCEEDED)
