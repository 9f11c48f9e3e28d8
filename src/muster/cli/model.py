"""`muster model ...`: the model registry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from muster.cli import render
from muster.cli.options import (
    HomeOption,
    JsonOption,
    LimitOption,
    OffsetOption,
    UrlOption,
    client,
)
from muster.states import ModelStage
from muster.words import count

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="The model registry: versions of verified trials' checkpoints, with "
                  "their lineage.",
                  no_args_is_help=True, rich_markup_mode=None, add_completion=False)


@app.command()
def create(
    name: str,
    description: Annotated[str, typer.Option(help="what the model is for")] = "",
    labels: Annotated[list[str] | None, typer.Option("--label", help="a label (repeat it)")]
    = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Make a new, empty model."""
    with client(home, url) as c:
        made = c.create_model(name, description, labels or [])
    if as_json:
        render.print_json(made)
    else:
        render.console.print(f"model {made['name']} created", markup=False)


@app.command()
def register(
    name: str,
    trial: Annotated[int, typer.Option("--trial", min=1, help="the trial whose checkpoint")],
    checkpoint: Annotated[str | None, typer.Option(help="the checkpoint's uuid or name")]
    = None,
    best: Annotated[bool, typer.Option("--best", help="its best checkpoint by the searcher's "
                                                      "metric")] = False,
    latest: Annotated[bool, typer.Option("--latest", help="its latest checkpoint (the "
                                                          "default)")] = False,
    accept_unverified: Annotated[str | None, typer.Option(
        "--accept-unverified", metavar="REASON",
        help="register a trial that was not verified (admins), marked with this reason")]
    = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Register a trial's checkpoint as the model's next version (v1, v2...). Only a
    verified trial is registered; a rejected one never."""
    if sum((checkpoint is not None, best, latest)) > 1:
        raise typer.BadParameter("choose one of --checkpoint, --best and --latest")
    with client(home, url) as c:
        version = c.register_model_version(name, trial, checkpoint=checkpoint,
                                           pick="best" if best else "latest",
                                           accept_unverified=accept_unverified)
    if as_json:
        render.print_json(version)
    else:
        render.console.print(_version_line(version), markup=False, soft_wrap=True)


@app.command("list")
def list_(offset: OffsetOption = 0, limit: LimitOption = None, as_json: JsonOption = False,
          home: HomeOption = None, url: UrlOption = None) -> None:
    """The models by name, 1,000 at a time (--offset, --limit): each one's latest version
    and how many it has."""
    with client(home, url) as c:
        models = c.list_models(offset=offset, limit=limit)
    command = "muster model list" + (f" --limit {limit}" if limit else "")
    if as_json:
        render.print_json(models)
        render.print_page_line("models", models, command, as_json=True)
        return
    for model in models:
        latest = model["versions"][-1] if model["versions"] else None
        render.console.print(f"{model['name']}: {model['versions_total']} versions"
                             + (f", latest {_version_line(latest)}" if latest else ""),
                             markup=False, soft_wrap=True)
    render.print_page_line("models", models, command, as_json=False)


@app.command()
def describe(name: str, as_json: JsonOption = False, home: HomeOption = None,
             url: UrlOption = None) -> None:
    """A model and its newest 100 versions: each one's trial, checkpoint, verdict and who
    registered it (`muster model versions NAME` lists every one)."""
    with client(home, url) as c:
        model = c.get_model(name)
    if as_json:
        render.print_json(model)
    else:
        render.console.print(f"{model['name']}: {model['description'] or '(no description)'}"
                             + (f" [{', '.join(model['labels'])}]" if model["labels"] else ""),
                             markup=False, soft_wrap=True)
        for version in model["versions"]:
            render.console.print(f"  {_version_line(version)}", markup=False, soft_wrap=True)
    if line := _older_versions_line(model):
        (render.err_console if as_json else render.console).print(line, markup=False,
                                                                  soft_wrap=True)


@app.command()
def versions(name: str, offset: OffsetOption = 0, limit: LimitOption = None,
             as_json: JsonOption = False, home: HomeOption = None,
             url: UrlOption = None) -> None:
    """A model's versions, oldest first, 1,000 at a time (--offset, --limit): stage, trial,
    checkpoint, verdict, metrics."""
    with client(home, url) as c:
        found = c.list_model_versions(name, offset=offset, limit=limit)
    command = f"muster model versions {name}" + (f" --limit {limit}" if limit else "")
    if as_json:
        render.print_json(found)
        render.print_page_line("versions", found, command, as_json=True)
        return
    if not found.total:
        render.console.print(f"model {name} has no version yet; `muster model register {name} "
                             "--trial ID` makes v1", markup=False)
    for version in found:
        metrics = ", ".join(f"{key} {render.number(value)}" for key, value
                            in sorted(version["metrics"].items())
                            if isinstance(value, int | float))
        render.console.print(_version_line(version) + (f"; {metrics}" if metrics else ""),
                             markup=False, soft_wrap=True)
    render.print_page_line("versions", found, command, as_json=False)


@app.command()
def download(
    ref: Annotated[str, typer.Argument(metavar="NAME[@VERSION|@STAGE]",
                                       help="the version: NAME (the latest), NAME@3, "
                                            "NAME@production or NAME@staging")],
    dest: Annotated[Path, typer.Argument(help="a new or empty directory")],
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Download a version's checkpoint into DEST, every file checked against its sha256."""
    with client(home, url) as c:
        version, found = c.download_model_version(ref, dest)
    if as_json:
        render.print_json({"version": version, "path": str(found.path),
                           "files": len(found.file_sizes),
                           "size": sum(found.file_sizes.values())})
        return
    render.console.print(f"{version['model']} v{version['version']} → {found.path}: "
                         f"{count(len(found.file_sizes), 'file')}, "
                         f"{render.size(sum(found.file_sizes.values()))}, every sha256 "
                         f"checked; {_verdict(version)}", markup=False, soft_wrap=True)


@app.command()
def stage(
    ref: Annotated[str, typer.Argument(metavar="NAME@VERSION")],
    to: Annotated[ModelStage, typer.Argument(metavar="STAGE",
                                             help="production, staging, archived or none")],
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Move a version to a stage (the model's owner or an admin). Production and staging
    hold one version each: the one there before is archived."""
    with client(home, url) as c:
        version = c.set_model_stage(ref, to.value)
    if as_json:
        render.print_json(version)
    else:
        render.console.print(_version_line(version), markup=False, soft_wrap=True)


@app.command()
def delete(
    ref: Annotated[str, typer.Argument(metavar="NAME | NAME@VERSION",
                                       help="a version, or a model without versions")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]
    = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Delete a version (its checkpoint is then no longer pinned against garbage
    collection), or a model whose versions are all deleted (admins). Asks first unless
    --yes."""
    what = f"version {ref}" if "@" in ref else f"model {ref}"
    if not yes and not render.confirmed(f"Delete {what}?"):
        render.console.print("nothing was deleted (--yes deletes without asking)",
                             markup=False)
        raise typer.Exit(1)
    with client(home, url) as c:
        gone: object = c.delete_model_version(ref) if "@" in ref else c.delete_model(ref)
    if as_json:
        render.print_json(gone)
    else:
        render.console.print(f"{what} deleted", markup=False)


def _older_versions_line(model: api.RegisteredModelView) -> str | None:
    """Which of the model's versions a description showed (the newest) and the command that
    lists them all; None where it showed every one."""
    shown, total = len(model["versions"]), model["versions_total"]
    if shown == total:
        return None
    return (f"showing the newest {shown:,} of {total:,} versions; every one: muster model "
            f"versions {model['name']} (1,000 a page: --offset)")


def _verdict(version: api.ModelVersionView) -> str:
    accepted = version["accepted_unverified"]
    return ("verified" if version["verified"] else
            f"UNVERIFIED, accepted by {accepted['by']}: {accepted['reason']}" if accepted
            else "not verified")


def _version_line(version: api.ModelVersionView) -> str:
    return (f"v{version['version']} ({version['stage']}): trial {version['trial_id']}, "
            f"checkpoint {version['checkpoint_uuid']}, {_verdict(version)}; registered by "
            f"{version['registered_by']}")


@app.command()
def export(
    ref: Annotated[str, typer.Argument(metavar="NAME@VERSION",
                                       help="the version: NAME@3, NAME@production, "
                                            "NAME@staging, or NAME (the latest)")],
    mlflow: Annotated[str | None, typer.Option(
        "--mlflow", metavar="URL",
        help="the MLflow tracking server to export to, reached from this machine as you; "
             "left out: the server exports to the one its cluster config names")] = None,
    registered_model: Annotated[str | None, typer.Option(
        "--registered-model", metavar="NAME",
        help="the model's name in MLflow's registry (default: the muster model's name)")]
    = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Hand a version to MLflow: a run with the trial's hyperparameters, metric series,
    muster's ids and verdict as tags, the checkpoint and artifacts as files, and a version
    in MLflow's registry linked to that run (needs `pip install 'muster[mlflow]'`)."""
    import tempfile
    from pathlib import Path

    from muster import mlflow_export

    if mlflow is None and registered_model is not None:
        raise typer.BadParameter(
            "--registered-model goes with --mlflow; the server names its own (the model's "
            "name after its cluster config's mlflow.registered_model_prefix)")
    with client(home, url) as c:
        if mlflow is None:
            made = c.export_model_version(ref)
        else:
            uri = mlflow_export.check_tracking_uri(mlflow)
            with tempfile.TemporaryDirectory(prefix="muster-export-") as work:
                made = mlflow_export.export_through_api(c, ref, uri, registered_model,
                                                        Path(work))
    if as_json:
        render.print_json(made)
        return
    render.console.print(
        f"{made['model']} v{made['version']} → MLflow at {made['tracking_uri']}: run "
        f"{made['run_id']} (experiment {made['experiment_id']}), registered model "
        f"{made['registered_model']} version {made['model_version']}\n"
        f"  run:     {made['run_url']}\n  version: {made['model_version_url']}",
        markup=False, soft_wrap=True)
