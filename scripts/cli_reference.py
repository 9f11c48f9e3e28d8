"""The CLI reference page, from the Typer app's own command tree (the site's hook runs it).

`python scripts/cli_reference.py` prints the page. Every command is what `muster ... --help`
says, so the page cannot drift from the CLI: arguments, options, their defaults and help.
Typer ships its own copy of click, so its objects are read by their attributes here, not
checked against the click the docs' tools install.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer

from muster.cli import app

HEADER = """# CLI reference

Generated from the `muster` command's own definitions when the site is built (every
`muster ... --help` says the same). Exit status 1 with one `error: ...` line on stderr is
muster's refusal; the JSON each `--json` prints is in the [JSON contract](json-contract.md),
the other exit statuses in [Scripting muster](scripting.md).

The CLI answers at once: a command imports only its own module, and `muster --help` imports
none. Shell completion (bash, zsh, fish) covers commands, subcommands and options:
`muster --install-completion` for the current shell (restart it after), or
`muster --show-completion bash > ~/.local/share/bash-completion/completions/muster`.
"""


def page() -> str:
    """The whole page: each command, depth first in the order `--help` lists them."""
    root = typer.main.get_command(app)
    parts = [HEADER, *_sections(root, ["muster"])]
    return "\n".join(parts)


def _sections(command: Any, path: list[str]) -> Iterator[str]:
    context = command.context_class(command, info_name=" ".join(path))
    yield _section(command, context, path)
    if hasattr(command, "list_commands"):
        for name in command.list_commands(context):
            sub = command.commands[name]
            if not sub.hidden:
                yield from _sections(sub, [*path, name])


def _section(command: Any, context: Any, path: list[str]) -> str:
    level = "#" * min(len(path) + 1, 4)
    usage = " ".join([*path, *command.collect_usage_pieces(context)])
    lines = [f"{level} `{' '.join(path)}`", "", _help(command), "",
             "```text", usage, "```", ""]
    rows = [_row(param, context) for param in command.get_params(context)
            if not getattr(param, "hidden", False) and param.name != "help"]
    if rows:
        lines += ["| Argument or option | Help |", "|---|---|", *rows, ""]
    return "\n".join(lines)


def _help(command: Any) -> str:
    text = (command.help or command.short_help or "").strip()
    # click's \b marks a paragraph it must not rewrap: Markdown keeps line breaks as written.
    return text.replace("\b\n", "")


def _row(param: Any, context: Any) -> str:
    """The option's line as `--help` prints it: its names and metavar, then its help with
    the default, env var and `[required]`."""
    names, help_text = param.get_help_record(context)
    return f"| `{names}` | {_cell(help_text)} |"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(page(), end="")
