"""`muster config ...`: experiment configs, read here without a server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from muster.config.determined import Translation

app = typer.Typer(help="Experiment configs: what muster makes of them, without a server.",
                  no_args_is_help=True, rich_markup_mode=None, add_completion=False)

NOT_READ = 2  # the exit status of a file that is no Determined config, or not a valid one


@app.callback()
def _group() -> None:
    """Experiment configs: what muster makes of them, without a server."""  # a group of one


@app.command("from-determined")
def from_determined(
    file: Annotated[Path, typer.Argument(help="a Determined experiment config (YAML)")],
    slots: Annotated[str, typer.Option(
        help="what Determined's slots are where it will run: gpu (a server that schedules "
             "GPUs) or cpu (one without: a process each)")] = "gpu",
) -> None:
    """Print the muster config a Determined experiment config maps to: the YAML on stdout,
    what each of its keys became (or why it is ignored) on stderr. Exit 2 when the file is
    not a Determined config, or muster cannot run it (each problem named)."""
    import yaml

    from muster.config import determined
    from muster.config.loading import parse_yaml, read_config_text, read_experiment_config
    from muster.errors import ConfigError

    source = str(file)
    if slots not in ("gpu", "cpu"):
        _refuse(f"--slots must be gpu or cpu, got {slots!r}")
    try:
        text = read_config_text(source)
        data = parse_yaml(text, source)
        if not isinstance(data, dict) or not determined.detect(data).is_determined:
            why = (determined.detect(data).reason() if isinstance(data, dict)
                   else "it is not a mapping of keys")
            _refuse(f"{source} is not a Determined experiment config: {why}; `muster "
                    "experiment create` reads it as muster's own")
        translation = read_experiment_config(text, source,
                                             "gpu" if slots == "gpu" else "cpu").translation
    except ConfigError as exc:
        _refuse(str(exc))
    assert translation is not None, "detected as Determined's above"
    print_translation(source, translation)
    sys.stdout.write(f"# muster's config for {source}, a Determined experiment config\n"
                     + yaml.safe_dump(translation.config, sort_keys=False, allow_unicode=True,
                                      width=100))


def print_translation(source: str, translation: Translation) -> None:
    """What each key of the Determined config `source` became, on stderr."""
    print(f"{source}: a Determined experiment config, read as muster's:", file=sys.stderr)
    for line in translation.lines:
        print(f"  {line}", file=sys.stderr)


def _refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(NOT_READ)
