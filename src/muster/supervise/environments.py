"""The environment gate: a queued trial starts only once its environment is built.

Before admission, each pass sorts the queued trials whose experiment needs a built
environment: built ones go on to the scheduler; the others wait in the queue, holding no
slot, their reason saying what the build does now ("building environment 3f2a9c1d…:
installing 2 packages (41 s)"), and the pass starts the builds that are not running
(`muster.environments.registry`: off the pass, in child processes). When a build failed,
its waiting trials get the failure policy: a resolver's "no solution" or a failed setup
command is PERMANENT_ERROR (the trials fail with those words); the package index not
answering is INFRA, charged to `trial_retries` and built again; muster's own failure is
INTERNAL, charged to `internal_retries`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy.orm import Session

from muster.environments.registry import EnvState
from muster.states import EnvironmentState, EventReason, Reason, TrialState
from muster.store import Trial, transition
from muster.store.configs import experiment_config
from muster.supervise.context import ACTOR, SupervisorContext
from muster.supervise.ending import record_decision

__all__ = ["EnvironmentGate", "QueuedTrial", "Sorted"]

_SHOWN_HASH = 8


@dataclass(frozen=True)
class _Failed:
    trial_id: int
    key: str
    state: EnvState


class QueuedTrial(NamedTuple):
    """What the gate reads of a queued trial."""

    id: int
    environment_key: str | None  # its experiment's (None: no environment to build)
    stop_requested: bool


@dataclass
class Sorted:
    """The queued trials of one pass, by where their environments stand."""

    ready: list[int] = field(default_factory=list)  # their ids, in the order given
    waiting: dict[int, str] = field(default_factory=dict)  # trial id -> its queue reason
    failed: list[_Failed] = field(default_factory=list)


@dataclass
class EnvironmentGate:
    ctx: SupervisorContext

    def sort(self, queued: Iterable[QueuedTrial]) -> Sorted:
        """Which queued trials may be scheduled; builds that are needed are started."""
        found = Sorted()
        states: dict[str, EnvState] = {}
        for trial in queued:
            key = trial.environment_key
            if key is None or trial.stop_requested:
                found.ready.append(trial.id)  # a killed one is cancelled by the launch step
                continue
            state = states.get(key)
            if state is None:
                state = self.ctx.envs.state(key)
                if state.state is EnvironmentState.MISSING:
                    state = self.ctx.envs.start(key)
                states[key] = state
            if state.state is EnvironmentState.READY:
                found.ready.append(trial.id)
            elif state.state is EnvironmentState.FAILED:
                found.failed.append(_Failed(trial.id, key, state))
            else:
                found.waiting[trial.id] = waiting_reason(key, state)
        return found

    def fail(self, failed: list[_Failed]) -> None:
        """Apply the failure policy to the trials whose environment failed to build; an
        INFRA or INTERNAL failure is forgotten afterwards, so the next pass builds again."""
        if not failed:
            return
        with self.ctx.store.session_scope() as s:
            for item in failed:
                trial = s.get_one(Trial, item.trial_id)
                if trial.state is TrialState.QUEUED:
                    _apply(s, trial, item)
        for key in {i.key for i in failed if i.state.reason in (Reason.INFRA, Reason.INTERNAL)}:
            self.ctx.envs.forget_failure(key)


def waiting_reason(key: str, state: EnvState) -> str:
    return (f"building environment {key[:_SHOWN_HASH]}…: {state.stage or 'starting'} "
            f"({state.seconds or 0:.0f} s)")


def _apply(s: Session, trial: Trial, item: _Failed) -> None:
    # The build says PERMANENT_ERROR, INFRA or INTERNAL; anything else is muster's fault.
    reason = item.state.reason or Reason.INTERNAL
    what = (f"its environment {item.key} could not be built: {item.state.message} "
            f"(the whole log: `muster env logs {item.key}`)")
    policy = experiment_config(trial.experiment).failure_policy
    budget, limit = {Reason.INFRA: ("trial_retries", policy.trial_retries),
                     Reason.INTERNAL: ("internal_retries", policy.internal_retries)
                     }.get(reason, (None, 0))
    if budget is not None and getattr(trial, budget) < limit:
        used = getattr(trial, budget) + 1
        setattr(trial, budget, used)
        record_decision(s, trial, EventReason.ENVIRONMENT,
                        f"{reason} failure; {what}; building it again (retry {used} of "
                        f"{limit})")
        return
    transition(s, trial, TrialState.STARTING, reason=EventReason.LAUNCHING, actor=ACTOR)
    transition(s, trial, TrialState.FAILED, reason=reason, actor=ACTOR,
               message=what[0].upper() + what[1:])
