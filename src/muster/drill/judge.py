"""What muster said about a run of a drill, and whether that caught its fault (pure).

A fault is *caught* when muster named it: the run did not end as the clean run did (not
SUCCEEDED, or no longer verified), or one of its attempts ended in a failure after the
fault was injected (muster saw it, and restarted the run). Hiding files a script had
already read is harmless, and muster can show it: where the run's sample count still passed,
the data fault is caught as harmless. A slow rank and a server restart must be
*survived*: muster is right when the run ends as the clean run did. A node's link cut for a
while is either named (Ray gave the node up, a peer timed out) or survived. The time to detect is
from the injection to the first thing muster recorded about it (an attempt's end, or the
trial's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from muster import api
from muster.drill.faults import advice
from muster.states import CheckStatus, DrillFault, Reason
from muster.words import count

__all__ = ["CleanRun", "clean_run", "judge", "summary"]


@dataclass(frozen=True)
class CleanRun:
    """The clean run as the faults' runs are compared with it."""

    state: str
    verified: bool | None
    seconds: float | None  # from RUNNING to its end
    checks: dict[str, CheckStatus]

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "verified": self.verified, "seconds": self.seconds,
                "checks": {name: str(status) for name, status in self.checks.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CleanRun:
        return cls(data["state"], data["verified"], data.get("seconds"),
                   {k: CheckStatus(v) for k, v in (data.get("checks") or {}).items()})


def clean_run(trial: api.TrialDetail | None) -> CleanRun:
    """The clean run's outcome, from its trial (None: it made none)."""
    if trial is None:
        return CleanRun("NO TRIAL", None, None, {})
    seconds = (trial["ended_at"] - trial["started_at"]
               if trial["ended_at"] is not None and trial["started_at"] is not None else None)
    return CleanRun(str(trial["state"]), trial["verified"], seconds, _checks(trial))


def _checks(trial: api.TrialDetail) -> dict[str, CheckStatus]:
    verification = trial["verification"] or {}
    found = verification.get("checks") or []
    return {str(c["name"]): CheckStatus(c["status"]) for c in found
            if isinstance(c, dict) and c.get("status") in tuple(CheckStatus)}


def judge(fault: DrillFault, trial: api.TrialDetail | None, injected_at: float,
          clean: CleanRun, *, timed_out: float | None = None,
          timeout: float | None = None) -> dict[str, Any]:
    """The report row of one fault's run (the `faults[]` entry of `muster drill --json`).

    Args:
        trial: its trial as it ended (or as it was when the drill gave up on it).
        timed_out: the seconds after which the drill stopped waiting and killed the run.
        timeout: the timeout a hang waits on (for the advice).
    """
    row: dict[str, Any] = {"name": str(fault), "injected_at": injected_at,
                           "expected": "survive" if fault.must_survive else "named"}
    if trial is None:
        return {**row, "state": None, "class": None, "message": "its experiment made no trial",
                "caught": False, "detect_seconds": None, "verdict": None,
                "advice": advice(fault, clean.checks, timeout=timeout)}
    named = _named_after(trial, injected_at)
    row |= {"state": str(trial["state"]), "trial_id": trial["id"],
            "verdict": trial["verdict"], "verified": trial["verified"],
            "class": named["reason"] if named else trial["reason"],
            "message": (named["message"] if named else trial["message"]) or trial["verdict"]}
    if timed_out is not None:
        row["message"] = (f"not caught within {timed_out:.0f} s of the fault; the drill "
                          f"stopped the run ({row['message']})")
        return {**row, "caught": False, "detect_seconds": None,
                "advice": advice(fault, clean.checks, timeout=timeout)}
    if fault.must_survive:
        same = str(trial["state"]) == clean.state and trial["verified"] == clean.verified
        return {**row, "caught": same, "detect_seconds": None,
                "advice": None if same else advice(fault, clean.checks, timeout=timeout)}
    as_clean = str(trial["state"]) == clean.state and trial["verified"] == clean.verified
    when = named["ended_at"] if named else (None if as_clean else trial["ended_at"])
    caught = when is not None
    if not caught and fault is DrillFault.NETWORK and as_clean:
        row["message"] = ("survived: the run ended as the clean run did (the link came back "
                          "before a peer or Ray gave the node up)")
        return {**row, "caught": True, "detect_seconds": None, "advice": None}
    if not caught and fault is DrillFault.DROP_DATA and _samples_passed(trial):
        row["message"] = ("harmless here: every sample was counted (the script had read "
                          "the files before they were hidden)")
        return {**row, "caught": True, "detect_seconds": None, "advice": None}
    return {**row, "caught": caught,
            "detect_seconds": None if when is None else round(max(0.0, when - injected_at), 2),
            "advice": None if caught else advice(fault, clean.checks, timeout=timeout)}


# The ends that name a fault: a failure muster classified. Not OK, not a stop it was asked
# for (the drill's own kill at its deadline), not a warm standby let go.
_NAMING = frozenset(str(r) for r in Reason) - {str(Reason.OK), str(Reason.STOPPED)}


def _samples_passed(trial: api.TrialDetail) -> bool:
    checks = _checks(trial)
    return CheckStatus.PASSED in (checks.get("samples"), checks.get("samples_from_log"))


def _named_after(trial: api.TrialDetail, injected_at: float) -> api.AttemptView | None:
    """The first attempt that ended in a failure after the fault, if any."""
    for attempt in trial["attempts"]:
        ended, reason = attempt["ended_at"], attempt["reason"]
        if (ended is not None and ended >= injected_at and not attempt["standby"]
                and reason in _NAMING):
            return attempt
    return None


def summary(rows: Sequence[Mapping[str, Any]], skipped: Sequence[tuple[str, str]]) -> str:
    """"8 of 10 faults caught; `corrupt-data` passed unnoticed: <advice>" and the skipped."""
    judged = [r for r in rows if r.get("caught") is not None]
    missed = [r for r in judged if not r["caught"]]
    parts = [f"{len(judged) - len(missed)} of {count(len(judged), 'fault')} caught"]
    by_advice: dict[str, list[str]] = {}
    for r in missed:
        if r.get("expected") != "survive":
            by_advice.setdefault(str(r["advice"]), []).append(f"`{r['name']}`")
    parts += [f"{' and '.join(names)} passed unnoticed: {text}"
              for text, names in by_advice.items()]
    parts += [f"`{r['name']}` changed muster's verdict to {r.get('verdict')}" for r in missed
              if r.get("expected") == "survive"]
    if skipped:
        parts.append("skipped: " + ", ".join(f"`{name}` ({why})" for name, why in skipped))
    return "; ".join(parts)
