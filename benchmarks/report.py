"""What a benchmark hands back, and how `run.py` shows it: Markdown tables and JSON."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Target:
    what: str
    measured: str
    met: bool


@dataclass
class Outcome:
    """One benchmark's result: tables to show, targets checked, raw samples for the JSON."""

    name: str
    tables: list[Table]
    targets: list[Target]
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


def describe_machine() -> dict[str, Any]:
    """Where the numbers were measured; the load average says how busy the machine was."""
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(_meminfo_kib("MemTotal") / 1024**2, 1),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        # Without a bytecode cache every muster process compiles muster's modules at start.
        "bytecode_cache": not os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "src_modified": bool(_git("status", "--porcelain", "--", "src")),
    }


def render_markdown(machine: dict[str, Any], outcomes: list[Outcome], command: str) -> str:
    changes = " + local changes in src/" if machine["src_modified"] else ""
    no_cache = "" if machine["bytecode_cache"] else ", PYTHONDONTWRITEBYTECODE=1"
    lines = [
        "# muster benchmarks",
        "",
        f"`{command}` on {machine['cpus']} CPUs ({machine['cpu_model']}), "
        f"{machine['memory_gib']} GiB, Linux {machine['kernel']}, Python {machine['python']}, "
        f"commit {machine['git_commit']}{changes}{no_cache}; "
        f"load average at start {machine['load_average_at_start']}.",
    ]
    for outcome in outcomes:
        for table in outcome.tables:
            lines += ["", *_table_lines(table)]
        if outcome.notes:
            lines += ["", *(f"- {note}" for note in outcome.notes)]
    targets = [t for o in outcomes for t in o.targets]
    if targets:
        summary = Table("Targets", ["target", "measured", "met"],
                        [[t.what, t.measured, "yes" if t.met else "**no**"] for t in targets])
        lines += ["", *_table_lines(summary)]
    return "\n".join(lines) + "\n"


def write_json(
    directory: Path, machine: dict[str, Any], outcomes: list[Outcome], command: str
) -> Path:
    """Write the results to `directory/results-<UTC time>.json` and to `latest.json`."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    document = {
        "command": command,
        "measured_at": stamp,
        "machine": machine,
        "benchmarks": {o.name: asdict(o) for o in outcomes},
    }
    text = json.dumps(document, indent=2) + "\n"
    path = directory / f"results-{stamp}.json"
    path.write_text(text)
    (directory / "latest.json").write_text(text)
    return path


def _table_lines(table: Table) -> list[str]:
    columns = list(zip(*table.rows, strict=True)) if table.rows else []
    align = ["--:" if i and all(_numeric(cell) for cell in column) else "---"
             for i, column in enumerate(columns)] or ["---"] * len(table.header)
    return [
        f"### {table.title}",
        "",
        "| " + " | ".join(table.header) + " |",
        "|" + "|".join(align) + "|",
        *("| " + " | ".join(row) + " |" for row in table.rows),
    ]


def _numeric(cell: str) -> bool:
    """True for cells like "12.3", "**95%**" or "" (numbers are right-aligned)."""
    bare = cell.strip("*% ")
    try:
        float(bare or "0")
    except ValueError:
        return False
    return True


def _meminfo_kib(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0])
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.machine()


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False)
    except OSError as exc:
        print(f"git is not available ({exc}); results carry no commit", file=sys.stderr)
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"
