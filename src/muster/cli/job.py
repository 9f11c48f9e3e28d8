"""`muster job ...`: the queue and what runs, and moving trials in the queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import (
    HomeOption,
    JsonOption,
    LimitOption,
    OffsetOption,
    UrlOption,
    client,
)
from muster.cli.quota import holder
from muster.priority import MAX_PRIORITY, MIN_PRIORITY
from muster.words import progress_line

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="The queue and what runs; move trials in the queue.",
                  no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)


@app.command("list")
def list_jobs(offset: OffsetOption = 0, limit: LimitOption = None, as_json: JsonOption = False,
              home: HomeOption = None, url: UrlOption = None) -> None:
    """Show the trials that run or wait: those holding resources, then the queue in its
    order (priority, then id), then paused ones, with why each queued one waits and how far
    each RUNNING one has come (and its ETA, where its planned length is known), 1,000 at a
    time (--offset, --limit); then the quotas of the users and groups, and what is in use
    of each."""
    with client(home, url) as c:
        jobs = c.list_jobs(offset=offset, limit=limit)
        quotas = [] if as_json else c.list_quotas()
    command = "muster job list" + (f" --limit {limit}" if limit else "")
    if as_json:
        render.print_json(jobs)
        render.print_page_line("jobs", jobs, command, as_json=True)
        return
    if jobs:
        render.console.print(jobs_table(jobs))
    elif not jobs.total:
        render.err_console.print("no trial runs or waits")
    render.print_page_line("jobs", jobs, command, as_json=False)
    for view in quotas:
        if view["subject"] != "default":
            render.console.print(f"{holder(view)}: {view['summary']}", markup=False)


def jobs_table(jobs: list[api.Job]) -> Table:
    table = Table("Trial", "Experiment", "State", "Priority", "Replicas", "GPUs/replica",
                  "GPUs held", "Progress", "Why it waits")
    for job in jobs:
        per_replica = str(job["gpus_per_replica"]) + (f" {job['gpu_type']}"
                                                      if job["gpu_type"] else "")
        experiment = f"{job['experiment_id']} {escape(job['experiment_name'])}"
        table.add_row(str(job["trial_id"]), experiment,
                      render.state(job["state"]), str(job["priority"]), str(job["replicas"]),
                      escape(per_replica), ", ".join(map(str, job["gpus"])) or "-",
                      escape(progress_line(job.get("progress"))),
                      escape(job["queue_reason"] or "-"))
    return table


@app.command("set-priority")
def set_priority(
    target_id: Annotated[int, typer.Argument(
        help="a trial id; with --experiment, an experiment id")],
    priority: Annotated[int, typer.Argument(
        min=MIN_PRIORITY, max=MAX_PRIORITY,
        help=f"{MIN_PRIORITY} to {MAX_PRIORITY}; lower runs first")],
    experiment: Annotated[bool, typer.Option(
        "--experiment", help="TARGET_ID is an experiment: set every trial of it that has not "
        "ended, and the trials it makes from now on")] = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Move a trial (or every trial of an experiment) in the queue; the next supervisor pass
    reorders the queue."""
    view: api.ExperimentDetail | api.TrialDescription
    with client(home, url) as c:
        if experiment:
            view = c.set_experiment_priority(target_id, priority)
        else:
            view = c.set_trial_priority(target_id, priority)
    if as_json:
        render.print_json(view)
        return
    what = "experiment" if experiment else "trial"
    render.console.print(f"{what} {target_id}: priority {view['priority']}")
