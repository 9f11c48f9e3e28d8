"""Human output: Rich tables and one-line summaries. Machine output is `--json`."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)

STATE_STYLE = {
    "SUCCEEDED": "green", "COMPLETED": "green", "FAILED": "red", "ERROR": "red",
    "SUSPECT": "yellow", "CANCELED": "magenta", "RUNNING": "cyan", "ACTIVE": "cyan",
}


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def state(value: str | None) -> str:
    style = STATE_STYLE.get(value or "", "")
    return f"[{style}]{value}[/]" if style else str(value)


def when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def duration(start: float | None, end: float | None) -> str:
    return f"{end - start:.1f}s" if start and end else "-"


def experiments_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("ID", "Name", "State", "Trials", "Created", "Ended")
    for exp in rows:
        trials = ", ".join(exp["trial_states"]) or "-"
        table.add_row(str(exp["id"]), exp["name"], state(exp["state"]), trials,
                      when(exp["created_at"]), when(exp["ended_at"]))
    return table


def trials_table(trials: list[dict[str, Any]]) -> Table:
    table = Table("Trial", "State", "Reason", "Restarts", "Started", "Ended")
    for trial in trials:
        table.add_row(str(trial["id"]), state(trial["state"]), trial["reason"] or "-",
                      str(trial["restarts"]), when(trial["started_at"]), when(trial["ended_at"]))
    return table


def attempts_table(trial: dict[str, Any]) -> Table:
    table = Table("Attempt", "Rank", "State", "Exit", "Signal", "Reason", "Duration", "Log")
    for attempt in trial["attempts"]:
        for rep in attempt["replicas"]:
            exit_code = "-" if rep["exit_code"] is None else str(rep["exit_code"])
            table.add_row(str(attempt["number"]), str(rep["rank"]), state(attempt["state"]),
                          exit_code, rep["signal"] or "-", rep["reason"] or "-",
                          duration(rep["started_at"], rep["ended_at"]), rep["log_path"])
    return table


def ended_replicas(trial: dict[str, Any]) -> list[str]:
    """One line per ended replica: how it ended, in words (invariant 7)."""
    return [f"attempt {a['number']}: {r['message']}"
            for a in trial["attempts"] for r in a["replicas"] if r["message"]]
