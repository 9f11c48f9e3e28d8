"""`muster checkpoint ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from muster.checkpoint_files import NAME, Inspection
from muster.cli import render
from muster.cli.options import (
    HomeOption,
    JsonOption,
    LimitOption,
    OffsetOption,
    UrlOption,
    client,
)

app = typer.Typer(help="List, download and garbage-collect checkpoints.",
                  no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)


@app.command("list")
def list_(
    trial_id: Annotated[int | None, typer.Argument(help="a trial's checkpoints")] = None,
    experiment: Annotated[int | None, typer.Option(
        "--experiment", "-e", help="every checkpoint of this experiment's trials")] = None,
    offset: OffsetOption = 0, limit: LimitOption = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List checkpoints, 1,000 at a time (--offset, --limit): step, size, state (local,
    uploading, stored, upload_failed, deleting, deleted), the searcher's metric, where it is
    stored, and why it is kept."""
    if (trial_id is None) == (experiment is None):
        raise typer.BadParameter("give a TRIAL_ID or --experiment ID (one of them)")
    with client(home, url) as c:
        rows = (c.list_checkpoints(trial_id, offset, limit) if trial_id is not None
                else c.list_experiment_checkpoints(experiment or 0, offset, limit))
    command = ("muster checkpoint list " + (str(trial_id) if trial_id is not None
                                            else f"--experiment {experiment}")
               + (f" --limit {limit}" if limit else ""))
    if as_json:
        render.print_json(rows)
    else:
        render.console.print(render.checkpoints_table(rows))
    render.print_page_line("checkpoints", rows, command, as_json=as_json)


@app.command()
def download(
    checkpoint: Annotated[str, typer.Argument(help="the checkpoint's id or uuid (or, as "
                                                   "before, a trial id followed by a name)")],
    directory: Annotated[str | None, typer.Argument(
        help="where to unpack it, new or empty (default: ./NAME)")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="the directory to unpack into (as DIRECTORY)")] = None,
    home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Download a checkpoint into a directory: from its run directory, or from storage when
    the run directory no longer holds it. Exits 0 only if every file's sha256 matched its
    metadata.json; when one does not, nothing is kept."""
    with client(home, url) as c:
        if directory is not None and NAME.fullmatch(directory) and checkpoint.isdigit():
            dest = output if output is not None else Path(directory)  # TRIAL_ID NAME
            found = c.download_checkpoint(int(checkpoint), directory, dest)
            name, trial_id = directory, int(checkpoint)
        else:
            chosen = output if output is not None else directory
            view = c.get_checkpoint(checkpoint)
            dest = Path(chosen) if chosen is not None else Path(view["name"])
            view, found = c.download_checkpoint_by_ref(checkpoint, dest)
            name, trial_id = view["name"], view["trial_id"]
    _print_files(found)
    render.console.print(
        f"checkpoint {name} (step {found.step}) of trial {trial_id} is in {dest}: "
        f"{len(found.file_sizes)} files, {render.size(found.size_bytes)}, each matching its "
        "sha256 in metadata.json", markup=False)


def _print_files(found: Inspection) -> None:
    for path, size in sorted(found.file_sizes.items()):
        render.console.print(f"  {path}  {render.size(size)}", markup=False)


@app.command()
def gc(
    experiment_id: int,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan, change "
                                                            "nothing")] = False,
    save_trial_latest: Annotated[int | None, typer.Option(min=0, max=1000)] = None,
    save_trial_best: Annotated[int | None, typer.Option(min=0, max=1000)] = None,
    save_experiment_best: Annotated[int | None, typer.Option(min=0, max=1000)] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Garbage-collect an experiment's checkpoints by its policy (Determined's save_*),
    printing each checkpoint with keep or delete and why. Counts given become the
    experiment's policy (re-applied at once); --dry-run only shows what would happen."""
    counts = {name: value for name, value in (
        ("save_trial_latest", save_trial_latest), ("save_trial_best", save_trial_best),
        ("save_experiment_best", save_experiment_best)) if value is not None}
    with client(home, url) as c:
        plan = c.collect_checkpoints(experiment_id, dry_run, counts)
    if as_json:
        render.print_json(plan)
        return
    render.console.print(render.gc_plan_table(plan))
    doomed = sum(not c["keep"] for c in plan["checkpoints"])
    verb = "would be" if dry_run else "are being"
    render.console.print(f"{doomed} of {len(plan['checkpoints'])} checkpoints {verb} "
                         "deleted", markup=False)
