"""A trial's verdict in one line: verified, not verified (why), SUSPECT (why), or how it ended.

`verdict_of` reads what a trial's record holds (its state, the reason and message of its
last move, the verification stored when it exited 0, whether the searcher stopped it) and
gives the pair the API serves as each trial's `verified` and `verdict`. The CLI and the
web UI print that line as it is, so a trial is described in the same words everywhere, and
nothing short of a verification whose `verified` is true is ever worded as verified
(invariant 1). Stdlib only: the CLI imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from muster.states import CheckStatus, EventReason, TrialState
from muster.words import NOT_VERIFIED  # "exit 0 — not verified", as trial messages say it

__all__ = ["MAX_DETAIL_CHARS", "MAX_VERDICT_CHARS", "NOT_VERIFIED", "NO_CHECK_INSPECTED",
           "SUSPECT", "Verdict", "VerdictCounts", "check_status", "count_verdicts",
           "verdict_of"]

VERIFIED = "verified"
SUSPECT = "SUSPECT"
NO_CHECK_INSPECTED = "no check inspected its results"
STOPPED_EARLY = "stopped early by the searcher"
COMPLETED = "completed"  # the check that the run reached its planned end
MAX_DETAIL_CHARS = 100  # one check's detail in a verdict; longer ones end in "…"
MAX_VERDICT_CHARS = 300  # the whole line
CUT = "…"
NOT_RUN_PREFIX = "not run:"
WARNING_PREFIX = "warning:"


@dataclass(frozen=True)
class Verdict:
    """`verified`: True only for a SUCCEEDED trial whose verification says so; None while
    it has not ended; False otherwise. `line`: what the CLI and the UI print."""

    verified: bool | None
    line: str


def verdict_of(state: str, verification: Mapping[str, Any] | None, *,
               early_stopped: bool = False, reason: str | None = None,
               message: str | None = None) -> Verdict:
    """The verdict on a trial in `state` (a `TrialState` value), whose last move had
    `reason` and `message`, and whose exit 0 was judged `verification` (null if never)."""
    trial_state = TrialState(state)
    if trial_state is TrialState.SUCCEEDED:
        return _succeeded(verification, early_stopped, reason)
    if trial_state is TrialState.SUSPECT:
        why = _failed_checks(verification) or _one_line(message or "a check failed")
        return Verdict(False, _bounded(f"{SUSPECT}: {why}"))
    if trial_state is TrialState.FAILED:
        return Verdict(False, _bounded(_failed_line(verification, reason, message)))
    if trial_state is TrialState.CANCELED:
        return Verdict(False, "canceled")
    return Verdict(None, trial_state.lower())


def _succeeded(verification: Mapping[str, Any] | None, early_stopped: bool,
               reason: str | None) -> Verdict:
    early = f" ({STOPPED_EARLY})" if early_stopped else ""
    if reason == EventReason.REVIEW_APPROVED:
        why = _failed_checks(verification) or "no verification recorded"
        return Verdict(False, _bounded(f"approved by review, not verified: {why}"))
    if verification is None:
        return Verdict(False, f"{NOT_VERIFIED}{early}: no verification recorded")
    if verification.get("verified") is True:
        warned = _details(verification, CheckStatus.WARNING)
        shown = f"; {'; '.join(warned)}" if warned else ""
        return Verdict(True, _bounded(f"{VERIFIED}{early}{shown}"))
    # Whether the run reached its planned end comes first: the evidence most often missing.
    # The verdict says why itself (`why_not_verified`); rows stored before it did are read.
    not_run = sorted(_details(verification, CheckStatus.NOT_RUN),
                     key=lambda detail: not detail.startswith(f"{COMPLETED}: "))
    stored = verification.get("why_not_verified")
    why = (_one_line(stored) if isinstance(stored, str) and stored
           else "; ".join(not_run) or NO_CHECK_INSPECTED)
    return Verdict(False, _bounded(f"{NOT_VERIFIED}{early}: {why}"))


def _failed_line(verification: Mapping[str, Any] | None, reason: str | None,
                 message: str | None) -> str:
    if reason == EventReason.REVIEW_REJECTED:
        why = _failed_checks(verification) or _one_line(message or "")
        return f"failed: rejected by review: {why}" if why else "failed: rejected by review"
    shown = _one_line(message or reason or "")
    return f"failed: {shown}" if shown else "failed"


def _failed_checks(verification: Mapping[str, Any] | None) -> str:
    return "; ".join(_details(verification, CheckStatus.FAILED))


def _details(verification: Mapping[str, Any] | None, status: CheckStatus) -> list[str]:
    """`name: detail` of each check with `status`, the detail on one line and cut short (a
    not-run check's without the "not run:" that the verdict's words already say)."""
    shown = []
    for check in _checks(verification):
        if check_status(check) is not status:
            continue
        detail = _one_line(str(check.get("detail") or ""))
        if status is CheckStatus.NOT_RUN and detail.lower().startswith(NOT_RUN_PREFIX):
            detail = detail[len(NOT_RUN_PREFIX):].strip()
        shown.append(f"{check.get('name')}: {_cut(detail, MAX_DETAIL_CHARS)}")
    return shown


def _checks(verification: Mapping[str, Any] | None) -> Iterable[Mapping[str, Any]]:
    checks = (verification or {}).get("checks")
    return [c for c in checks if isinstance(c, Mapping)] if isinstance(checks, list) else []


def check_status(check: Mapping[str, Any]) -> CheckStatus:
    """A check's status as stored, or for a check stored before checks had one: passed,
    unless its detail starts with "warning:" (a warning); not passed: failed."""
    stored = check.get("status")
    if isinstance(stored, str) and stored in tuple(CheckStatus):
        return CheckStatus(stored)
    if not check.get("passed"):
        return CheckStatus.FAILED
    detail = str(check.get("detail") or "").lstrip().lower()
    return CheckStatus.WARNING if detail.startswith(WARNING_PREFIX) else CheckStatus.PASSED



@dataclass(frozen=True)
class VerdictCounts:
    """An experiment's trials by verdict: SUCCEEDED ones verified or not, and SUSPECT ones."""

    verified: int = 0
    not_verified: int = 0
    suspect: int = 0

    def to_json(self) -> dict[str, int]:
        return {"verified": self.verified, "not_verified": self.not_verified,
                "suspect": self.suspect}

    @classmethod
    def from_json(cls, counts: Mapping[str, Any]) -> VerdictCounts:
        return cls(verified=int(counts.get("verified", 0)),
                   not_verified=int(counts.get("not_verified", 0)),
                   suspect=int(counts.get("suspect", 0)))

    def words(self) -> str:
        """"2 verified, 1 not verified, 1 SUSPECT" (every count, zeros too)."""
        return ", ".join(self._parts())

    def brief(self) -> str:
        """The counts that are not 0, for a table cell ("" when all are)."""
        return ", ".join(part for part in self._parts() if not part.startswith("0 "))

    def _parts(self) -> list[str]:
        return [f"{self.verified} verified", f"{self.not_verified} not verified",
                f"{self.suspect} {SUSPECT}"]


def count_verdicts(states: Sequence[str], succeeded_verified: Iterable[bool | None]
                   ) -> VerdictCounts:
    """The counts from every trial's state and the `verified` of each SUCCEEDED one."""
    flags = list(succeeded_verified)
    verified = sum(flag is True for flag in flags)
    return VerdictCounts(verified=verified, not_verified=len(flags) - verified,
                         suspect=sum(state == TrialState.SUSPECT for state in states))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - len(CUT)].rstrip() + CUT


def _bounded(line: str) -> str:
    return _cut(line, MAX_VERDICT_CHARS)
