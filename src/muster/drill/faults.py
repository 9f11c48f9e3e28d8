"""What each fault of a drill needs, and what to change when muster did not catch it.

Pure: the runner asks `skip_reason` before a fault's run is made (a fault this server or
this config cannot have is reported skipped, with the reason), and the judge asks `advice`
for a fault that passed unnoticed, given which of muster's checks ran in the clean run
(a check that did not run there cannot have caught anything).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from muster.errors import ConfigError
from muster.states import CheckStatus, DrillFault
from muster.words import span

__all__ = ["DATA_FAULTS", "MID_RUN", "Situation", "advice", "parse_faults", "skip_reason"]

DATA_FAULTS = frozenset({DrillFault.CORRUPT_DATA, DrillFault.DROP_DATA})
# Injected when the run is due (a fraction of its planned length, or of the clean run's
# time); corrupt-data is made in the run's copy of the data before it starts.
MID_RUN = frozenset(DrillFault) - {DrillFault.CORRUPT_DATA}


@dataclass(frozen=True)
class Situation:
    """What a fault's run needs, as this server and this config have it."""

    data_path: str | None  # the data directory inside the context (data.path or --data)
    reports_metrics: bool  # the harness, or an integration that may report through it
    replicas: int
    root: bool  # the server may mount a file system (disk-full)
    admin: bool  # the drill's owner may restart the server (server-restart)
    ray: bool  # trials run on Ray nodes (network)
    link_commands: bool = False  # the cluster config names how to cut a node's link


def skip_reason(fault: DrillFault, situation: Situation) -> str | None:
    """Why `fault` cannot run here, or None when it can."""
    if fault in DATA_FAULTS and situation.data_path is None:
        return ("muster does not know which files are the data: add `data: {path: DIR}` "
                "to the config, or name it with `muster drill --data DIR`")
    if fault is DrillFault.NAN and not situation.reports_metrics:
        return ("a plain script's numbers are its own: muster makes a loss NaN only where "
                "it is reported through the harness or an integration (`harness: true`, "
                "or `integrations: auto` with Lightning, Transformers or Accelerate)")
    if fault is DrillFault.DISK_FULL and not situation.root:
        return "mounting the drill's small file system needs a server running as root"
    if fault is DrillFault.SERVER_RESTART and not situation.admin:
        return "restarting the server stops it for everyone: an admin's drill only"
    if fault is DrillFault.NETWORK and not situation.ray:
        return ("cutting a node's link needs trials on Ray nodes (`launcher: ray`); this "
                "server runs trials on its own machine")
    if fault is DrillFault.NETWORK and not situation.link_commands:
        return ("the cluster config does not say how to cut a node's link: an admin names "
                "the commands in `ray.drill_network: {cut: [...], restore: [...]}`")
    return None


def advice(fault: DrillFault, clean_checks: Mapping[str, CheckStatus], *,
           timeout: float | None = None) -> str:
    """What to change in the script or the config so a run like this is caught, given the
    clean run's checks (name → status) and, for a hang, the timeout muster waited on."""
    ran = {name for name, status in clean_checks.items()
           if status in (CheckStatus.PASSED, CheckStatus.WARNING, CheckStatus.FAILED)}
    if fault in DATA_FAULTS:
        return _data_advice(ran)
    if fault is DrillFault.HANG:
        waited = "" if timeout is None else f" (it waits {span(timeout)})"
        return ("muster ends a silent run after failure_policy.silence_timeout, a harness "
                f"run after heartbeat_timeout{waited}: lower it to a few times the longest "
                "quiet stretch of a healthy run")
    if fault is DrillFault.DISK_FULL:
        if "checkpoint" in ran or "outputs" in ran:
            return ("the script went on after its writes failed and its results still "
                    "passed: make it raise on a failed save (never catch OSError around "
                    "torch.save)")
        return ("the script swallowed its write errors: require its results, "
                "`verify.require_checkpoint: true` (harness) or `verify.outputs: [FILE]`")
    if fault is DrillFault.NAN:
        return ("a NaN loss went unnoticed: keep `verify.finite_metrics: true` and report "
                "the loss every step (ctx.report_training), not only at the end")
    if fault is DrillFault.NETWORK:
        waited = "" if timeout is None else f" (it waits {span(timeout)})"
        return ("a rank cut off from its peers waited for them unnoticed: give the "
                "collectives a timeout shorter than the run's "
                "(`init_process_group(timeout=...)`), and lower failure_policy."
                f"heartbeat_timeout or silence_timeout{waited} so a stuck rank is ended")
    if fault in (DrillFault.KILL_RANK, DrillFault.OOM):
        return ("the run ended verified although a rank was killed: declare its planned "
                "length (`verify.expected_length`, ctx.plan()) so a run cut short fails "
                "`completed`, and save checkpoints so a restart resumes")
    return ("muster's verdict differs from the clean run's: this is muster's bug, please "
            "report it with the drill's report")


def _data_advice(ran: set[str]) -> str:
    if "samples" not in ran and "samples_from_log" not in ran:
        return ("your loader skips unreadable or missing files and nothing counts what it "
                "read: add `data: {path: DIR}` so muster counts the files, and count the "
                "samples (ctx.samples.seen(n) with the harness, or "
                "`verify.samples_from_log: 'samples=(?P<samples>[0-9]+)'` for a line the "
                "script prints each epoch) so muster compares them")
    return ("the loader read damaged files without an error and the sample count still "
            "matched: check each sample as you decode it (raise on a short or undecodable "
            "file) rather than substituting one")


def parse_faults(words: Iterable[str]) -> tuple[DrillFault, ...]:
    """The faults named (comma-separated words allowed), in the drill's order.

    Raises:
        ConfigError: a word names no fault; the message lists them.
    """
    named = [w.strip() for word in words for w in word.split(",") if w.strip()]
    known = {str(f): f for f in DrillFault}
    unknown = [w for w in named if w not in known]
    if unknown:
        raise ConfigError(f"no fault is called {', '.join(map(repr, unknown))}; the faults "
                          f"are {', '.join(known)}")
    chosen = {known[w] for w in named}
    return tuple(f for f in DrillFault if f in chosen)
