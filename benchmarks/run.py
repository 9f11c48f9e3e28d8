"""muster's side-by-side benchmarks: `make bench`, or `.venv/bin/python benchmarks/run.py`.

Each benchmark measures muster and its baseline in the same run, interleaved, and reports
medians and ratios (see docs/benchmarks.md). The Markdown report goes to stdout, progress
to stderr, and every sample to `benchmarks/out/results-<time>.json` (and `latest.json`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import auth
import cli_startup
import curves_coarse
import describe_pages
import diagnostics_overhead
import evidence
import first_log
import harness_overhead
import ingest
import integrations_overhead
import log_limit
import log_search
import manifest_scan
import pass_sessions
import queue_throughput
import ray_launcher
import recovery
import replica_cgroup
import replicas
import runtime_base
import scale
import silence
import tail
import throughput
import tune_peer
import ui_budget
import wakeups
from report import Outcome, describe_machine, render_markdown, write_json

import checkpoint_storage

# This folder's environments.py and search.py: ruff sorts them apart, as tests/environments/
# and tests/search/ exist.
import environments
import search

OUT_DIR = Path(__file__).resolve().parent / "out"

BENCHMARKS: dict[str, Callable[[bool], Outcome]] = {
    "first_log": first_log.run,
    "cli_startup": cli_startup.run,
    "throughput": throughput.run,
    "log_limit": log_limit.run,
    "tail": tail.run,
    "log_search": log_search.run,
    "harness_overhead": harness_overhead.run,
    "manifest_scan": manifest_scan.run,
    "pass_sessions": pass_sessions.run,
    "silence": silence.run,
    "evidence": evidence.run,
    "ingest": ingest.run,
    "replicas": replicas.run,
    "recovery": recovery.run,
    "queue": queue_throughput.run,
    "search": search.run,
    "environments": environments.run,
    "runtime_base": runtime_base.run,
    "auth": auth.run,
    "ui_budget": ui_budget.run,
    "checkpoint_storage": checkpoint_storage.run,
    "diagnostics_overhead": diagnostics_overhead.run,
    "integrations_overhead": integrations_overhead.run,
    "scale": scale.run,
    "describe_pages": describe_pages.run,
    "curves_coarse": curves_coarse.run,
    "wakeups": wakeups.run,
    "replica_cgroup": replica_cgroup.run,
    "ray_launcher": ray_launcher.run,  # skipped without ray[default,train]: `make bench-ray`
    "tune_peer": tune_peer.run,  # skipped without ray[tune]: `make bench-tune`
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: fewer repetitions and smaller files (~1 minute)")
    parser.add_argument("--only", action="append", choices=list(BENCHMARKS),
                        help="run only this benchmark (repeatable)")
    args = parser.parse_args(argv)
    command = shlex.join([Path(sys.executable).name, "benchmarks/run.py",
                          *(sys.argv[1:] if argv is None else argv)])
    machine = describe_machine()
    outcomes = []
    for name in args.only or list(BENCHMARKS):
        started, load_before = time.monotonic(), os.getloadavg()[0]
        print(f"running {name}...", file=sys.stderr, flush=True)
        outcome = BENCHMARKS[name](args.quick)
        load_after = os.getloadavg()[0]
        outcome.notes.append(f"1-minute load average {load_before:.1f} at the start, "
                             f"{load_after:.1f} at the end ({os.cpu_count()} CPUs).")
        outcome.data["load_average"] = [load_before, load_after]
        outcomes.append(outcome)
        print(f"  {name} took {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    print(render_markdown(machine, outcomes, command), end="")
    path = write_json(OUT_DIR, machine, outcomes, command)
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
