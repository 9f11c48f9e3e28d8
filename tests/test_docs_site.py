"""The parts of the documentation site generated at build time (scripts/docs_hooks.py): the
CLI reference has every command, the Concepts page finds the module map in
docs/architecture.md, the Determined page every foreign key. `make docs` (strict) builds
the rest."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from muster.cli import COMMANDS, app

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))  # the generators

import cli_reference
import determined_keys
import module_map


def _leaves(command: Any, path: list[str]) -> list[str]:
    if not hasattr(command, "list_commands"):
        return [" ".join(path)]
    context = command.context_class(command, info_name=path[-1])
    return [leaf for name in command.list_commands(context)
            if not command.commands[name].hidden
            for leaf in _leaves(command.commands[name], [*path, name])]


def test_the_cli_page_has_a_section_per_command() -> None:
    page = cli_reference.page()
    commands = _leaves(typer.main.get_command(app), ["muster"])
    assert len(commands) > 40
    missing = [c for c in commands if f"`{c}`\n" not in page]
    assert missing == []
    assert not any(f"## `muster {name}`" in page
                   for name, entry in COMMANDS.items() if entry.hidden)


def test_the_module_map_is_architecture_mds_diagram() -> None:
    text = module_map.module_map()
    assert text.rstrip().endswith("```")
    assert "cli ──▶ client" in text and "harness ──▶ core only" in text


def test_the_determined_table_names_every_foreign_key() -> None:
    table = determined_keys.table()
    assert "| `resources.slots_per_trial` |" in table
    assert "| `max_restarts` |" in table
    assert len(table.splitlines()) == 2 + len(list(
        determined_keys.foreign_keys(determined_keys.ExperimentConfig, "")))
