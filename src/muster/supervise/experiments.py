"""Closing experiments: one whose trials all exist and have ended ends too.

`CANCELED` if it (or every trial of it) was killed, `COMPLETED` if a trial succeeded, else
`ERROR`; a PAUSED one too, when its trials have all ended. A search
draws its trials as it goes, so an experiment closes only once it has all `max_trials` of
them, was killed, or stopped drawing (`searching`: its first trials all failed alike, or it
has nothing to draw; its ERROR then says why); a SUSPECT trial keeps it open until
reviewed. So no ACTIVE experiment waits in silence with nothing running, queued or left to
draw: the search's top-up draws every search with room (one of `max_trials: 1` too), and
what cannot draw says why with its `search stopped` event, which ends it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import BindParameter, bindparam, func, select
from sqlalchemy.orm import selectinload

from muster.states import EventReason, ExperimentState, TrialState, values
from muster.store import Event, Experiment, Store, Trial, transition
from muster.supervise.context import ACTOR
from muster.supervise.isolation import Isolation
from muster.supervise.searching import is_search, note_search_end, stopped_drawing

__all__ = ["Closing", "experiment_end"]


@dataclass
class Closing:
    store: Store
    isolation: Isolation

    def close(self) -> None:
        """End the experiments whose trials have all ended (selected in SQL: a pass must not
        load every running experiment's trials)."""
        # Every trial it runs exists (a search draws them as it goes), or it was killed.
        created = (select(func.count(Trial.id)).where(Trial.experiment_id == Experiment.id)
                   .scalar_subquery())
        # (A search killed before its first draw has no trial at all.)
        gave_up = select(Event.id).where(
            Event.experiment_id == Experiment.id,
            Event.reason == EventReason.SEARCH_STOPPED).exists()
        has_trials = (((created > 0) & (created >= Experiment.max_trials))
                      | Experiment.stop_requested.is_(True) | gave_up)
        # The ended states as literals, not parameters: PostgreSQL's generic plan for a
        # prepared `NOT IN ($1, $2, $3)` guesses that almost no trial is unfinished and scans
        # every trial once per experiment (seconds at 10,000 experiments).
        ended: BindParameter[list[str]] = bindparam(
            "ended", values(TrialState.terminal()), expanding=True,
            literal_execute=True)
        unfinished = select(Trial.id).where(
            Trial.experiment_id == Experiment.id, Trial.state.not_in(ended)).exists()
        searches: list[int] = []
        with self.store.session_scope() as s:
            # Those without a trial left to run first, one index lookup each: with a long
            # queue that is nearly none, and the counts and the events are read for those
            # alone (in one query, a database counted every experiment's trials).
            # (A PAUSED one too: its trials may all have ended, killed one by one.)
            done = s.scalars(select(Experiment.id).where(
                Experiment.state.in_([ExperimentState.ACTIVE, ExperimentState.PAUSED]),
                ~unfinished)).all()
            ending = s.scalars(select(Experiment).options(selectinload(Experiment.trials))
                               .where(Experiment.id.in_(done), has_trials)) if done else ()
            for experiment in ending:
                states = [t.state for t in experiment.trials]
                if not all(st.is_terminal() for st in states):
                    continue
                drawn_none = stopped_drawing(s, experiment.id) if not states else None
                if not (states or experiment.stop_requested or drawn_none):
                    continue
                end, why = experiment_end(experiment.stop_requested, states)
                if is_search(experiment):
                    searches.append(experiment.id)
                message = (stopped_drawing(s, experiment.id)
                           if end is ExperimentState.ERROR else None)
                transition(s, experiment, end, reason=why, actor=ACTOR, message=message)
        for experiment_id in searches:  # (each reads its config: isolated)
            with (self.isolation.experiment(experiment_id, "noting the end of its search"),
                  self.store.session_scope() as s):
                note_search_end(s, s.get_one(Experiment, experiment_id))


def experiment_end(killed: bool, states: Sequence[TrialState]
                   ) -> tuple[ExperimentState, EventReason]:
    """How an experiment whose trials have all ended ends, and why: one killed, or whose
    every trial was killed (`muster trial kill`), is CANCELED."""
    if killed or (states and all(st is TrialState.CANCELED for st in states)):
        return ExperimentState.CANCELED, EventReason.KILLED
    if TrialState.SUCCEEDED in states:
        return ExperimentState.COMPLETED, EventReason.TRIALS_FINISHED
    return ExperimentState.ERROR, EventReason.NO_TRIAL_SUCCEEDED
