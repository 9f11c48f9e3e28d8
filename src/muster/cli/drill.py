"""`muster drill CONFIG CONTEXT`: run your experiment once clean and once per fault, and
see which faults muster catches (docs/how-to/drills.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.drill.faults import parse_faults
from muster.errors import InvalidRequest, ServerUnavailable
from muster.states import DrillFault

POLL_S = 2.0
WIDE = 160  # columns from which the report is a table
SHORT_S = 10.0  # a clean run shorter than this may end before a mid-run fault lands
AWAY_S = 180.0  # how long the server may be away (restarting) before the drill gives up
_FAULTS = ", ".join(f.value for f in DrillFault)


def drill(
    config: Annotated[Path | None, typer.Argument(help="experiment config (YAML)")] = None,
    context_dir: Annotated[Path | None, typer.Argument(
        help="the context directory (default: the config's directory)")] = None,
    faults: Annotated[str | None, typer.Option(
        help=f"comma-separated, some of: {_FAULTS} (default: every one)")] = None,
    scale: Annotated[float, typer.Option(
        help="the planned length of each run, as a fraction of the config's "
             "(`--epochs 15` runs 2 at 0.1)")] = 0.1,
    data: Annotated[str | None, typer.Option(
        help="the data directory inside the context, where the config has no `data:`")] = None,
    at: Annotated[float, typer.Option(
        help="when a mid-run fault is injected: this fraction of the run")] = 0.5,
    experiment: Annotated[int | None, typer.Option(
        "--experiment", metavar="ID", help="drill experiment ID as it was submitted, "
        "instead of CONFIG and CONTEXT")] = None,
    report: Annotated[int | None, typer.Option(
        "--report", metavar="DRILL", help="print drill DRILL's report (waits for its end "
        "unless --no-wait)")] = None,
    wait: Annotated[bool, typer.Option(help="wait for the drill's end")] = True,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Drill your training script: run it clean and under each fault, and report what
    muster caught.

    Each run is an experiment of its own (labelled `drill`, its length scaled by --scale,
    on a copy of the data); each fault is made by muster from outside the script. The
    report gives, per fault: when it was injected, what muster said, whether that caught
    it, how long that took, and what to change when it did not. Exits 0 when every fault
    run was caught, 1 when one passed unnoticed, 2 when the drill could not run."""
    words = [] if faults is None else [str(f) for f in parse_faults([faults])]
    with client(home, url) as c:
        if report is not None:
            view = c.get_drill(report)
        elif experiment is not None:
            view = c.drill_experiment(experiment, faults=words, scale=scale, data=data, at=at)
        elif config is not None:
            view = c.create_drill(config.read_text(), context_dir or config.parent,
                                  faults=words, scale=scale, data=data, at=at)
        else:
            raise InvalidRequest("name a config (and its context), --experiment ID or "
                                 "--report DRILL")
        if not as_json:
            render.err_console.print(f"drill {view['id']} of {view['name']}: clean run "
                                     f"(experiment {view['experiment_ids'][0]}) first, "
                                     f"then {len(view['faults'])} faults", markup=False)
        if wait:
            view = _follow(c, view, quiet=as_json)
    if as_json:
        render.print_json(view)
    else:
        _print_report(view)
    raise typer.Exit(_status(view))


def _follow(c: Any, view: Any, *, quiet: bool) -> Any:
    """Poll the drill until it ends, saying each run's end as it comes."""
    said: set[str] = set()
    while view["state"] == "RUNNING":
        time.sleep(POLL_S)
        view = _read(c, view)
        if quiet:
            continue
        if view["clean"]["state"] and "clean" not in said:
            said.add("clean")
            render.err_console.print(f"clean run: {view['clean']['verdict']}", markup=False)
            _warn_if_short(view["clean"]["seconds"])
        for row in view["faults"]:
            if row["run_state"] in ("ENDED", "SKIPPED") and row["name"] not in said:
                said.add(row["name"])
                render.err_console.print(f"{row['name']}: {_said(row)}", markup=False)
    return view


def _warn_if_short(seconds: float | None) -> None:
    if seconds is not None and seconds < SHORT_S:
        render.err_console.print(
            f"the clean run took {seconds:.1f} s: a fault due mid-run may come after the "
            "work is done (reported \"not injected\"); a larger --scale gives longer runs",
            markup=False)


def _read(c: Any, view: Any) -> Any:
    """The drill now; while the server is away (its server-restart fault), the last view,
    for up to `AWAY_S`."""
    try:
        fresh = c.get_drill(view["id"])
    except ServerUnavailable:
        away = view.get("_away_since") or time.monotonic()
        if time.monotonic() - away > AWAY_S:
            raise
        return {**view, "_away_since": away}
    return fresh


def _said(row: Any) -> str:
    if row["skipped"]:
        return f"skipped ({row['skipped']})"
    caught = {True: "caught", False: "NOT CAUGHT", None: "not judged"}[row["caught"]]
    return f"{caught}: {row['state']} {row['class'] or ''} {row['message'] or ''}".strip()


def _print_report(view: Any) -> None:
    """The report: a table where the terminal is wide enough, else a block per fault."""
    clean = view["clean"]
    render.console.print(f"drill {view['id']}: {view['name']} ({view['state']}); clean run: "
                         f"{clean['verdict'] or clean['state']}", markup=False)
    if view["scaled"]:
        render.console.print("scaled: " + "; ".join(view["scaled"]), markup=False)
    cells = [_cells(row) for row in view["faults"]]
    if render.console.width >= WIDE:
        table = Table("fault", "injected", "what muster said", "caught?", "detected in",
                      "what to change", show_lines=True)
        for row in cells:
            table.add_row(*row)
        render.console.print(table)
    else:
        for name, when, said, caught, detect, advice in cells:
            head = f"{name}: {caught}" + (f" in {detect}" if detect else "")
            render.console.print(head + (f" (injected {when})" if when else ""), markup=False)
            render.console.print(f"  muster said: {said}", markup=False)
            if advice:
                render.console.print(f"  what to change: {advice}", markup=False)
    if view["summary"]:
        render.console.print(view["summary"], markup=False)


def _cells(row: Any) -> tuple[str, str, str, str, str, str]:
    """One fault's row: name, injected, what muster said, caught?, detected in, advice."""
    when = ("" if row["injected_at"] is None
            else time.strftime("%H:%M:%S", time.localtime(row["injected_at"])))
    said = (f"skipped: {row['skipped']}" if row["skipped"] else
            " ".join(str(x) for x in (row["state"], row["class"], row["message"]) if x))
    words = ({True: "survived", False: "NOT SURVIVED"} if row["expected"] == "survive"
             else {True: "caught", False: "NOT CAUGHT"})
    caught = words.get(row["caught"], "—")
    detect = "" if row["detect_seconds"] is None else f"{row['detect_seconds']:.1f} s"
    return row["name"], when, said, caught, detect, row["advice"] or ""


def _status(view: Any) -> int:
    if view["state"] == "RUNNING":
        return 0
    if view["clean"]["state"] != "SUCCEEDED":
        return 2
    return 1 if any(row["caught"] is False for row in view["faults"]) else 0
