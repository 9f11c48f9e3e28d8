"""Quotas and groups on the real database, both backends (issue 36, deliverable 2): limits
set and cleared at runtime over the cluster config's, groups, who may change them, the 429
of a create past `max_queued_trials` (also under concurrent creates, which never queue one
trial too many), the searcher's draws that stop at the quota, and admission that waits for
the pass where a quota limits what runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from muster.config.quotas import QuotasConfig
from muster.errors import Conflict, Forbidden, NotFound, QuotaExceeded
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.schedule.local_placement import LocalPlacement
from muster.services import groups, quotas
from muster.services.access import Principal
from muster.services.experiments import NewExperiments, PlainSubmission, create_experiments
from muster.states import QuotaLimit, QuotaSubject, Role, TrialState
from muster.store import Attempt, Event, Experiment, Quota, Store, Trial
from muster.supervise.supervisor import Supervisor
from tests.accounts import add_user, first_admin

L, S = QuotaLimit, QuotaSubject
SINGLE = yaml.safe_dump({"name": "q", "entrypoint": ["true"]})


def config(**limits: Any) -> QuotasConfig:
    return QuotasConfig.model_validate(limits)


def create(store: Store, home: Home, who: Principal, quota: QuotasConfig, count: int = 1,
           text: str = SINGLE) -> list[int]:
    return create_experiments(PlainSubmission(store, home, quotas=quota), who,
                              NewExperiments([text] * count))


def queued(store: Store, *owners: Principal) -> int:
    with store.session_scope() as s:
        return s.scalar(select(func.count(Trial.id)).join(Experiment).where(
            Trial.state == TrialState.QUEUED,
            Experiment.owner_id.in_([o.user_id for o in owners]))) or 0


@pytest.fixture
def people(store: Store, home: Home) -> dict[str, Principal]:
    return {"admin": first_admin(store, home), "alice": add_user(store, "alice"),
            "bob": add_user(store, "bob"), "carol": add_user(store, "carol"),
            "viv": add_user(store, "viv", Role.VIEWER)}


def test_runtime_limits_win_over_the_config_and_clearing_brings_it_back(
        store: Store, people: dict[str, Principal]) -> None:
    admin = people["admin"]
    quota = config(users={"alice": {"max_gpus": 4}}, default={"max_queued_trials": 10})
    view = quotas.set_limits(store, quota, admin, S.USER, "alice", {L.MAX_GPUS: 8})
    assert view["limits"] == [
        {"limit": "max_gpus", "value": 8, "source": "set by an admin"},
        {"limit": "max_queued_trials", "value": 10, "source": "default, cluster config"}]
    assert view["summary"] == "0 of 8 GPUs, 0 of 10 queued trials"
    quotas.set_limits(store, quota, admin, S.USER, "alice", {L.MAX_GPUS: None})
    assert quotas.user_quotas(store, quota, "alice")["quotas"][0]["summary"] == (
        "no limit on GPUs, 0 of 10 queued trials")
    view = quotas.clear_limits(store, quota, admin, S.USER, "alice")
    assert view["summary"] == "0 of 4 GPUs, 0 of 10 queued trials"
    with store.session_scope() as s:
        assert s.scalars(select(Quota)).all() == []
        told = [e.message for e in s.scalars(select(Event).where(
            Event.reason == "quota changed").order_by(Event.id))]
    assert told == ["user alice's quota: set max_gpus (config) → 8",
                    "user alice's quota: set max_gpus 8 → no limit",
                    "user alice's quota: cleared max_gpus (the cluster config's apply)"]


def test_the_list_shows_the_default_users_groups_and_what_the_config_names_in_vain(
        store: Store, people: dict[str, Principal]) -> None:
    admin = people["admin"]
    quota = config(users={"ghost": {"max_gpus": 1}}, groups={"vision": {"max_slots": 4}},
                   default={"max_running_trials": 2})
    groups.create_group(store, admin, "vision", "the vision team")
    groups.add_members(store, admin, "vision", ["alice", "bob"])
    listed = {(v["subject"], v["name"]): v for v in quotas.list_quotas(store, quota)}
    assert listed[S.DEFAULT, None]["summary"] == "2 running trials"
    assert listed[S.USER, "alice"]["summary"] == "0 of 2 running trials"
    assert listed[S.GROUP, "vision"]["members"] == ["alice", "bob"]
    assert listed[S.GROUP, "vision"]["in_use"] == {"slots": 0, "gpus": 0, "running_trials": 0,
                                                   "queued_trials": 0}
    assert listed[S.USER, "ghost"]["known"] is False
    assert "no user ghost on this server" in listed[S.USER, "ghost"]["summary"]
    alice = quotas.user_quotas(store, quota, "alice")
    assert alice["groups"] == ["vision"]
    assert alice["summary"] == ("alice's quota: 0 of 2 running trials; group vision's quota: "
                                "0 of 4 slots")


def test_only_admins_change_quotas_and_groups_and_unknown_names_are_404s(
        store: Store, people: dict[str, Principal]) -> None:
    quota = config()
    for who in (people["alice"], people["viv"]):
        with pytest.raises(Forbidden, match="cannot set quotas: it takes the admin role"):
            quotas.set_limits(store, quota, who, S.USER, "alice", {L.MAX_GPUS: 99})
        with pytest.raises(Forbidden, match="cannot manage groups"):
            groups.create_group(store, who, "mine")
    with pytest.raises(NotFound, match="no user 'nobody'; `muster user list` shows them"):
        quotas.set_limits(store, quota, people["admin"], S.USER, "nobody", {L.MAX_GPUS: 1})
    with pytest.raises(NotFound, match="no group 'nope'"):
        quotas.clear_limits(store, quota, people["admin"], S.GROUP, "nope")


def test_groups_are_made_filled_emptied_and_deleted_with_their_limits(
        store: Store, people: dict[str, Principal]) -> None:
    admin = people["admin"]
    groups.create_group(store, admin, "nlp")
    with pytest.raises(Conflict, match="group 'nlp' exists already"):
        groups.create_group(store, admin, "nlp")
    with pytest.raises(NotFound, match=r"no user 'zed'; .* nobody was changed"):
        groups.add_members(store, admin, "nlp", ["alice", "zed"])
    assert groups.get_group(store, "nlp")["members"] == []
    groups.add_members(store, admin, "nlp", ["bob", "alice"])
    groups.add_members(store, admin, "nlp", ["alice"])  # twice: once
    assert groups.remove_members(store, admin, "nlp", ["bob"])["members"] == ["alice"]
    quotas.set_limits(store, config(), admin, S.GROUP, "nlp", {L.MAX_GPUS: 2})
    assert groups.delete_group(store, admin, "nlp")["members"] == ["alice"]
    assert groups.list_groups(store) == []
    with store.session_scope() as s:
        assert s.scalars(select(Quota)).all() == []  # its limits went with it
    assert quotas.user_quotas(store, config(), "alice")["groups"] == []


def test_a_create_past_max_queued_trials_is_refused_and_names_the_quota(
        store: Store, home: Home, people: dict[str, Principal]) -> None:
    alice = people["alice"]
    quota = config(users={"alice": {"max_queued_trials": 3}})
    create(store, home, alice, quota, count=2)
    with pytest.raises(QuotaExceeded) as refused:
        create(store, home, alice, quota, count=2)
    assert str(refused.value) == (
        "alice's quota: 2 of 3 queued trials, and this submission queues 2 more; wait for "
        "some to start or end, kill some (muster job list), or ask an admin to raise it "
        "(muster quota set --user alice --max-queued-trials N)")
    assert refused.value.http_status == 429
    create(store, home, alice, quota)  # one more fits
    create(store, home, people["bob"], quota, count=5)  # bob has no quota
    assert queued(store, alice) == 3


def test_a_groups_max_queued_trials_counts_its_members_together(
        store: Store, home: Home, people: dict[str, Principal]) -> None:
    admin, alice, bob = people["admin"], people["alice"], people["bob"]
    groups.create_group(store, admin, "vision")
    groups.add_members(store, admin, "vision", ["alice", "bob"])
    quota = config(groups={"vision": {"max_queued_trials": 3}})
    create(store, home, alice, quota, count=2)
    with pytest.raises(QuotaExceeded, match=r"^group vision's quota: 2 of 3 queued trials, "
                                            r"and this submission queues 2 more"):
        create(store, home, bob, quota, count=2)
    create(store, home, bob, quota)
    create(store, home, people["carol"], quota, count=4)  # not a member


def _race(tries: int, attempt: Callable[[int], object]) -> list[object]:
    """Run `attempt(i)` for each i on its own thread, all released at once; what each
    returned, or the exception it raised."""
    start = threading.Barrier(tries)

    def one(i: int) -> object:
        start.wait()
        try:
            return attempt(i)
        except Exception as exc:  # noqa: BLE001 - what it raised is the result
            return exc

    with ThreadPoolExecutor(tries) as pool:
        return list(pool.map(one, range(tries)))


def test_concurrent_creates_never_queue_past_the_quota(
        store: Store, home: Home, people: dict[str, Principal]) -> None:
    """Eight creates of one user, and six of two members of one group, all at once: as
    many succeed as the quota has room for, the others are 429s, none queues one too many."""
    alice = people["alice"]
    quota = config(users={"alice": {"max_queued_trials": 3}},
                   groups={"vision": {"max_queued_trials": 4}})
    results = _race(8, lambda _: create(store, home, alice, quota))
    made = [r for r in results if isinstance(r, list)]
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    assert (len(made), len(refused)) == (3, 5), results
    assert queued(store, alice) == 3

    admin, bob, carol = people["admin"], people["bob"], people["carol"]
    groups.create_group(store, admin, "vision")
    groups.add_members(store, admin, "vision", ["bob", "carol"])
    results = _race(6, lambda i: create(store, home, (bob, carol)[i % 2], quota))
    assert sum(isinstance(r, list) for r in results) == 4, results
    assert all(isinstance(r, list | QuotaExceeded) for r in results), results
    assert queued(store, bob, carol) == 4


def test_a_search_draws_no_trial_past_max_queued_trials(
        store: Store, home: Home, people: dict[str, Principal]) -> None:
    """A random search of 6, 5 at once, for a user who may queue 2 and run none: the
    supervisor's passes draw 2 trials; raised to 3 at runtime, a third. Nothing runs."""
    admin, alice = people["admin"], people["alice"]
    quota = config(users={"alice": {"max_queued_trials": 2, "max_running_trials": 0}})
    search = yaml.safe_dump({
        "name": "search", "entrypoint": ["true"],
        "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        "searcher": {"name": "random", "metric": "loss", "max_trials": 6,
                     "max_concurrent_trials": 5}})
    (experiment_id,) = create(store, home, alice, quota, text=search)
    supervisor = Supervisor(store, LocalLauncher(), home, LocalPlacement(store, slots=4),
                            min_free_disk=0, quotas=quota)

    def drawn() -> list[Trial]:
        supervisor.tick()
        supervisor.tick()
        with store.session_scope() as s:
            return list(s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)))

    trials = drawn()
    assert [t.state for t in trials] == ["QUEUED", "QUEUED"]
    assert trials[0].queue_reason == (
        "alice's quota allows 0 running trials, but this trial needs 1; an admin can raise it "
        "(muster quota set --user alice --max-running-trials N), or lower resources.replicas")
    quotas.set_limits(store, quota, admin, S.USER, "alice", {L.MAX_QUEUED_TRIALS: 3})
    assert len(drawn()) == 3


def test_a_create_by_a_user_whose_quota_limits_what_runs_waits_for_the_pass(
        store: Store, home: Home, people: dict[str, Principal]) -> None:
    """Admission at submission (`Supervisor.admitting_new`) leaves a quota's counting to the
    pass: two creates at once of a user who may run one start nothing by themselves."""
    alice = people["alice"]
    quota = config(users={"alice": {"max_running_trials": 1}})
    supervisor = Supervisor(store, LocalLauncher(), home, LocalPlacement(store, slots=4),
                            min_free_disk=0, quotas=quota)
    submission = PlainSubmission(store, home, admit=supervisor.admitting_new, quotas=quota)
    create_experiments(submission, people["bob"], NewExperiments([SINGLE]))
    _race(2, lambda _: create_experiments(submission, alice, NewExperiments([SINGLE])))
    with store.session_scope() as s:
        owners = s.execute(select(Experiment.owner_id).join(Trial).join(Attempt)).all()
        waiting = s.scalars(select(Trial.state).join(Experiment)
                            .where(Experiment.owner_id == alice.user_id)).all()
    assert owners == [(people["bob"].user_id,)]  # bob's started at once
    assert waiting == ["QUEUED", "QUEUED"]  # with 3 slots free, alice's wait for the pass
