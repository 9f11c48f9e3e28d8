"""The chaos soak's stream of experiments: what kinds it submits, and each one's config.

Every experiment runs `soak_job.py` (copied into the soak's context) for a few seconds:
single trials and 2-rank trials, plain scripts and harness scripts, random searches of 3
trials, with a `verify` block or without one, and a few built to misbehave (fewer samples
reported than trained, or a non-zero exit), which must never end SUCCEEDED. The choice and
the lengths come from the soak's seeded `random.Random`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LABEL = "soak"
NAME_PREFIX = "soak-"
# Short enough that a stopped (SIGSTOP) rank is found within the soak, long enough that a
# loaded 2-core machine does not stall a healthy one: every process writes a record a step.
FAILURE_POLICY = "{silence_timeout: 10s, heartbeat_timeout: 20s, stop_grace: 5s}"
SAMPLES_FROM_LOG = r"'epoch (?P<epoch>\d+) rank \d+ samples=(?P<samples>\d+)'"
BATCH = 4  # samples a rank reports a step (soak_job.py --batch)


@dataclass(frozen=True)
class Kind:
    """One kind of experiment in the stream."""

    name: str
    weight: float
    harness: bool = False
    replicas: int = 1
    search: bool = False
    verify: bool = True  # a verify block: expected samples (and, plain, read from the log)
    misbehaves: str | None = None  # "drop": fewer samples reported; "exit": exits 3

    @property
    def trials(self) -> int:
        return 3 if self.search else 1


KINDS = (
    Kind("plain", 3),
    Kind("plain-bare", 1.5, verify=False),
    Kind("harness", 3, harness=True),
    Kind("harness-bare", 1.5, harness=True, verify=False),
    Kind("ddp-plain", 1.5, replicas=2),
    Kind("ddp-harness", 1.5, harness=True, replicas=2),
    Kind("search", 1.5, harness=True, search=True),
    Kind("search-bare", 0.5, harness=True, search=True, verify=False),
    Kind("plain-drop", 0.75, misbehaves="drop"),
    Kind("harness-drop", 0.75, harness=True, misbehaves="drop"),
    Kind("plain-exit", 0.5, verify=False, misbehaves="exit"),
)
BY_NAME = {kind.name: kind for kind in KINDS}


@dataclass(frozen=True)
class Submission:
    number: int
    kind: Kind
    name: str
    config: str


def next_submission(number: int, rng: random.Random) -> Submission:
    """The stream's `number`-th experiment: a kind drawn by weight, a few seconds long."""
    kind = rng.choices(KINDS, weights=[k.weight for k in KINDS])[0]
    name = f"{NAME_PREFIX}{number:05d}-{kind.name}"
    epochs, steps = rng.randint(2, 4), rng.randint(6, 12)
    pause = round(rng.uniform(0.05, 0.12), 3)
    return Submission(number, kind, name, config_of(kind, name, epochs, steps, pause))


def config_of(kind: Kind, name: str, epochs: int, steps: int, pause: float) -> str:
    """The experiment's YAML."""
    argv = ["python", "soak_job.py", "--epochs", str(epochs), "--steps", str(steps),
            "--batch", str(BATCH), "--pause", str(pause)]
    argv += ["--harness"] * kind.harness
    argv += {"drop": ["--drop", "0.25"], "exit": ["--exit", "3"], None: []}[kind.misbehaves]
    lines = [f"name: {name}", f"labels: [{LABEL}]", f"entrypoint: {' '.join(argv)}",
             f"failure_policy: {FAILURE_POLICY}"]
    if kind.harness:
        lines.append("harness: true")
    if kind.replicas > 1:
        lines.append(f"resources: {{replicas: {kind.replicas}}}")
    if kind.search:
        lines += ["hyperparameters: {scale: {type: double, minval: 0.5, maxval: 1.5}}",
                  "searcher: {name: random, max_trials: 3, metric: loss, "
                  "max_concurrent_trials: 2}"]
    if kind.verify:
        lines.append(f"verify: {_verify(kind, epochs, steps)}")
    return "\n".join(lines) + "\n"


def _verify(kind: Kind, epochs: int, steps: int) -> str:
    expected = kind.replicas * steps * BATCH
    if kind.harness:
        return f"{{expected_samples: {expected}}}"
    return (f"{{expected_samples: {expected}, samples_from_log: {SAMPLES_FROM_LOG}, "
            f"expected_length: {{epochs: {epochs}}}}}")
