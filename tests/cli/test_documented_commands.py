"""Every `muster ...` command line shown to a reader (README, docs, examples) exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from muster.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMMAND_LINE = re.compile(r"^\s*(?:\$ )?muster ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)")
FENCE = re.compile(r"^```.*?$(.*?)^```", re.S | re.M)


def _shown_lines() -> list[tuple[str, str]]:
    """(where, words) for each command line: in Markdown only inside fenced blocks (in a
    transcript, its `$ ` lines), in an example's source anywhere (its docstring tells the
    reader how to run it)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in FENCE.findall(path.read_text()):
            found += [(str(path.relative_to(ROOT)), m.group(1))
                      for m in map(COMMAND_LINE.match, _command_lines(block)) if m]
    for path in sorted((ROOT / "examples").rglob("*")):
        if path.suffix in {".py", ".sh", ".yaml"}:
            found += [(str(path.relative_to(ROOT)), m.group(1))
                      for m in map(COMMAND_LINE.match, path.read_text().splitlines()) if m]
    return found


def _command_lines(block: str) -> list[str]:
    """A transcript's `$ ` lines (the rest is what the commands printed), else every line."""
    lines = block.splitlines()
    prompted = [line for line in lines if line.startswith("$ ")]
    return prompted or lines


def _resolves(words: list[str]) -> bool:
    command: Any = typer.main.get_command(app)  # typer ships its own click
    for word in words:
        if not hasattr(command, "commands"):
            return True  # a leaf: the rest are its arguments
        sub = command.commands.get(word)
        if sub is None:
            return False
        command = sub
    return True


def test_the_readers_commands_are_found() -> None:
    shown = _shown_lines()
    assert any(where.startswith("examples/") for where, _ in shown)  # it looks where it should
    assert len(shown) > 10


@pytest.mark.parametrize(("where", "words"), _shown_lines())
def test_a_documented_command_exists(where: str, words: str) -> None:
    assert _resolves(words.split()), f"{where} shows `muster {words}`, which is no command"
