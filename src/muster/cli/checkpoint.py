"""`muster checkpoint ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client

app = typer.Typer(help="List and download trials' checkpoints.", no_args_is_help=True)


@app.command("list")
def list_(
    trial_id: int, as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List a trial's checkpoints: step, attempt, size, and whether each is intact."""
    with client(home, url) as c:
        rows = c.list_checkpoints(trial_id)
    render.print_json(rows) if as_json else render.console.print(render.checkpoints_table(rows))


@app.command()
def download(
    trial_id: int,
    name: str,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="the directory to unpack into, new or empty (default: ./NAME)",
    )] = None,
    home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Download an intact checkpoint (NAME as `checkpoint list` shows it) into a directory.

    Every file is checked against its sha256 in the checkpoint's metadata.json before the
    directory gets its name; when one does not match, nothing is kept.
    """
    dest = output if output is not None else Path(name)
    with client(home, url) as c:
        found = c.download_checkpoint(trial_id, name, dest)
    for path, size in sorted(found.file_sizes.items()):
        render.console.print(f"  {path}  {render.size(size)}", markup=False)
    render.console.print(
        f"checkpoint {name} (step {found.step}) of trial {trial_id} is in {dest}: "
        f"{len(found.file_sizes)} files, {render.size(found.size_bytes)}, each matching its "
        "sha256 in metadata.json", markup=False)
