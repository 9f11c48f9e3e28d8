"""Reading and following logs from the terminal: every attempt of a trial, and every trial of
a search, with the restarts and the trials' ends shown.

A trial's attempts are read (or followed) one at a time, in order; between two attempts a
marker line says why the next one started (`── attempt 2 (restart after rank 1 ended
INFRA: SIGKILL) ──`). Markers go to stdout on a terminal and to stderr otherwise, so
`muster trial logs ID > file` keeps only the logs' bytes. A search is followed trial by trial
as they start, each of its lines prefixed `[trial N] ` (N its place in the search), with a
line when each ends. Output is decoded as UTF-8 with replacement (incrementally, so a
character split across two reads is decoded whole).
"""

from __future__ import annotations

import codecs
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from muster.cli import render
from muster.client import Client, at_rest
from muster.errors import NotFound, TooManyRequests
from muster.states import ExperimentState, Reason, TrialState

if TYPE_CHECKING:
    from muster import api

__all__ = ["FOLLOW_POLL_S", "NOT_SUCCEEDED", "NOT_VERIFIED", "LineWriter", "all_verified",
           "attempt_marker", "exit_code", "follow_experiment", "follow_trial",
           "print_trial_logs", "succeeded"]

FOLLOW_POLL_S = 0.5
Write = Callable[[str], None]


NOT_SUCCEEDED = 1  # the experiment did not complete, or a trial did not succeed
NOT_VERIFIED = 3  # with --require-verified: it succeeded, but a trial was not verified


def succeeded(exp: api.ExperimentDetail) -> bool:
    """The contract of `--follow` and `--wait`: exit 0 only for this."""
    return (exp["state"] == ExperimentState.COMPLETED
            and all(t["state"] == TrialState.SUCCEEDED for t in exp["trials"]))


def all_verified(exp: api.ExperimentDetail) -> bool:
    """Every SUCCEEDED trial of the experiment was verified."""
    return all(render.verified(t) is True for t in exp["trials"]
               if t["state"] == TrialState.SUCCEEDED)


def exit_code(exps: Iterable[api.ExperimentDetail], require_verified: bool) -> int:
    """How `--follow` and `--wait` exit: 0, `NOT_SUCCEEDED` unless every experiment
    COMPLETED with every trial SUCCEEDED, else with `require_verified` `NOT_VERIFIED` if a
    SUCCEEDED trial was not verified."""
    ended = list(exps)
    if not all(succeeded(exp) for exp in ended):
        return NOT_SUCCEEDED
    if require_verified and not all(all_verified(exp) for exp in ended):
        return NOT_VERIFIED
    return 0


def attempts_of(trial: api.TrialDetail) -> list[api.AttemptView]:
    """The trial's attempts that ran (a warm standby that was never promoted did not)."""
    return [a for a in trial["attempts"] if not a.get("standby")]


def attempt_marker(attempt: api.AttemptView, before: api.AttemptView | None) -> str:
    """`── attempt 2 (restart after rank 1 ended INFRA: SIGKILL) ──`."""
    why = ""
    if before is not None:
        cause = next((r for r in before["replicas"]
                      if r["reason"] not in (None, Reason.OK, Reason.STOPPED)), None)
        if cause is not None:
            signal = f": {cause['signal']}" if cause.get("signal") else ""
            why = f" (restart after rank {cause['rank']} ended {cause['reason']}{signal})"
        else:
            why = f" (after attempt {before['number']} ended {before['state']})"
    return f"── attempt {attempt['number']}{why} ──"


@dataclass
class Output:
    """Where the logs and the markers go, and how bytes become text."""

    logs: TextIO = field(default_factory=lambda: sys.stdout)
    markers: TextIO | None = None  # default: the logs on a terminal, else stderr

    def __post_init__(self) -> None:
        if self.markers is None:
            self.markers = self.logs if self.logs.isatty() else sys.stderr

    def marker(self, text: str) -> None:
        assert self.markers is not None
        if self.markers is self.logs:
            self.logs.flush()
        print(text, file=self.markers, flush=True)


def print_trial_logs(client: Client, trial_id: int, out: Write, output: Output, *,
                     attempt: int | None, rank: int | None, tail: int | None) -> None:
    """Every attempt's log in order (or only `attempt`'s; with `tail`, only the latest's
    last lines), with a marker between attempts."""
    if attempt is not None or tail is not None:
        _print_attempt(client, trial_id, out, attempt=attempt, rank=rank, tail=tail)
        return
    before = None
    for record in attempts_of(client.get_trial(trial_id)):
        if before is not None:
            output.marker(attempt_marker(record, before))
        _print_attempt(client, trial_id, out, attempt=record["number"], rank=rank, tail=None)
        before = record


def _print_attempt(client: Client, trial_id: int, out: Write, *, attempt: int | None,
                   rank: int | None, tail: int | None) -> None:
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    offset, cursor = 0, None
    while True:
        piece = client.read_logs(trial_id, attempt=attempt, rank=rank, offset=offset,
                                 cursor=cursor, tail=tail)
        out(decode(piece.data))
        if not piece.data:
            break
        # A tail longer than one read goes on from where the first read ended.
        attempt, tail = piece.attempt, None
        if rank is None and piece.next_cursor is not None:
            cursor = piece.next_cursor
        else:  # one rank's bytes (or a server from before merged logs)
            offset = piece.next_offset or 0
    out(decode(b"", final=True))


def follow_trial(client: Client, trial_id: int, out: Write, output: Output, *,
                 attempt: int | None = None, rank: int | None = None,
                 tail: int | None = None) -> api.TrialDescription:
    """The trial's logs as they are written, attempt by attempt with a marker between them,
    until it is at rest (only `attempt`'s, when one is named); the trial at the end."""
    trial = client.get_trial(trial_id)
    ran = attempts_of(trial)
    number = attempt or (ran[-1]["number"] if tail is not None and ran else 1)
    while True:
        came = _follow_attempt(client, trial_id, out, number, rank, tail,
                               missing_ok=attempt is None)
        tail = None
        trial = client.get_trial(trial_id)
        if attempt is not None:
            return trial
        done = next((a for a in attempts_of(trial) if a["number"] == number), None)
        later = [a for a in attempts_of(trial) if a["number"] > number]
        if later:
            output.marker(attempt_marker(later[0], done))
            number = later[0]["number"]
        elif TrialState(trial["state"]).is_at_rest():
            return trial
        elif done is not None:
            number += 1  # it waits for its next attempt (a restart, or a resume)
        elif not came:
            time.sleep(FOLLOW_POLL_S)  # that attempt has not started yet: ask again soon


def _follow_attempt(client: Client, trial_id: int, out: Write, number: int, rank: int | None,
                    tail: int | None, missing_ok: bool) -> bool:
    """One attempt's log until it ends; False if the attempt does not exist (yet). With
    `missing_ok` that is no error: the attempt may still come (a restart waiting for slots),
    or never (the trial ended first), which the caller tells apart."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    try:
        for chunk in client.follow_logs(trial_id, attempt=number, rank=rank, tail=tail,
                                        one_attempt=True):
            out(decode(chunk))
    except NotFound:
        if not missing_ok:
            raise
        return False
    out(decode(b"", final=True))
    return True


class LineWriter:
    """Writes text whole lines at a time, each prefixed, from several threads at once."""

    def __init__(self, stream: TextIO, lock: threading.Lock, prefix: str) -> None:
        self.stream, self.lock, self.prefix = stream, lock, prefix
        self.pending = ""

    def __call__(self, text: str) -> None:
        self.pending += text
        lines = self.pending.split("\n")
        self.pending = lines.pop()
        if lines:
            with self.lock:
                self.stream.write("".join(f"{self.prefix}{line}\n" for line in lines))
                self.stream.flush()

    def close(self) -> None:
        if self.pending:
            self("\n")


def follow_experiment(client: Client, experiment: api.ExperimentDetail, output: Output,
                      connect: Callable[[], Client], poll_s: float = FOLLOW_POLL_S
                      ) -> api.ExperimentDetail:
    """Every trial of a search as it starts, its lines prefixed `[trial N] `, and a line as
    each ends, until the experiment is at rest; the experiment at the end."""
    lock = threading.Lock()
    followers: dict[int, threading.Thread] = {}
    announced: set[int] = set()
    while True:
        exp = client.get_experiment_whole(experiment["id"])
        for trial in exp["trials"]:
            if trial["id"] not in followers and attempts_of(trial):
                followers[trial["id"]] = _start(connect, trial, output, lock)
        for trial in exp["trials"]:
            thread = followers.get(trial["id"])
            if (thread is not None and not thread.is_alive() and trial["id"] not in announced
                    and TrialState(trial["state"]).is_at_rest()):
                announced.add(trial["id"])
                with lock:
                    output.marker(_ended_line(trial, exp))
        if at_rest(exp) and all(not t.is_alive() for t in followers.values()) and all(
                t["id"] in announced or not attempts_of(t) for t in exp["trials"]):
            return exp
        time.sleep(poll_s)


def _start(connect: Callable[[], Client], trial: api.TrialDetail, output: Output,
           lock: threading.Lock) -> threading.Thread:
    writer = LineWriter(output.logs, lock, f"[trial {trial['number']}] ")

    def follow() -> None:
        prefixed = _Prefixed(output, writer, lock)
        with connect() as own:  # one HTTP client per thread
            try:
                follow_trial(own, trial["id"], writer, prefixed)
            except TooManyRequests as exc:  # the server caps the streams one token holds
                prefixed.marker(f"not following this trial's log: {exc} (muster trial logs "
                                f"{trial['id']} shows it)")
            finally:
                writer.close()

    thread = threading.Thread(target=follow, name=f"follow-trial-{trial['id']}", daemon=True)
    thread.start()
    return thread


class _Prefixed(Output):
    """A trial's markers, prefixed like its lines."""

    def __init__(self, output: Output, writer: LineWriter, lock: threading.Lock) -> None:
        super().__init__(output.logs, output.markers)
        self.writer, self.lock = writer, lock

    def marker(self, text: str) -> None:
        with self.lock:
            super().marker(f"{self.writer.prefix}{text}")


def _ended_line(trial: api.TrialDetail, exp: api.ExperimentDetail) -> str:
    """`[trial 2] trial 3 ended SUCCEEDED (val_accuracy 0.986111, stopped early): verified
    (stopped early by the searcher)`: its verdict (`muster.verdicts`) last."""
    metric = (exp.get("search") or {}).get("metric")
    details = []
    if metric and metric in trial.get("best_validation", {}):
        details.append(f"{metric} {render.number(trial['best_validation'][metric])}")
    if trial.get("early_stopped"):
        details.append("stopped early")
    shown = f" ({', '.join(details)})" if details else ""
    return (f"[trial {trial['number']}] trial {trial['id']} ended {trial['state']}{shown}: "
            f"{render.verdict(trial)}")

