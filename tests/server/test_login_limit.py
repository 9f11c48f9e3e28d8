"""`LoginLimiter`'s rules on a clock of the test's own: growing delays per (address, name)
and per address, nothing per name alone, an address that logged a user in is never held
back for them, and bounded memory; and the `trusted_proxies` the app believes. (Over HTTP:
tests/server/test_web_sessions.py.)"""

from __future__ import annotations

import pytest

from muster.errors import ConfigError, TooManyRequests
from muster.server.app import trusted_proxies
from muster.server.login_limit import (
    FIRST_DELAY_S,
    FREE_PER_ADDRESS,
    FREE_PER_NAME,
    MAX_DELAY_S,
    LoginLimiter,
    delay_after,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> LoginLimiter:
    return LoginLimiter(clock=clock)


def fail(limiter: LoginLimiter, name: str | None, address: str) -> None:
    limiter.begin(name, address).failed()


def succeed(limiter: LoginLimiter, name: str | None, address: str) -> None:
    limiter.begin(name, address).succeeded()


def wait_of(limiter: LoginLimiter, name: str | None, address: str) -> int | None:
    """The Retry-After of a login now, or None when it is let in (then counted failed)."""
    try:
        fail(limiter, name, address)
    except TooManyRequests as exc:
        return exc.retry_after
    return None


@pytest.mark.parametrize(("failures", "delay"), [
    (0, 0.0), (FREE_PER_NAME - 1, 0.0), (FREE_PER_NAME, FIRST_DELAY_S),
    (FREE_PER_NAME + 1, 2 * FIRST_DELAY_S), (FREE_PER_NAME + 3, 8 * FIRST_DELAY_S),
    (FREE_PER_NAME + 40, MAX_DELAY_S), (10**9, MAX_DELAY_S),
])
def test_the_delay_doubles_past_the_free_failures(failures: int, delay: float) -> None:
    assert delay_after(failures, FREE_PER_NAME) == delay


def test_the_delay_grows_with_each_failure_and_a_success_starts_afresh(
    limiter: LoginLimiter, clock: Clock
) -> None:
    for _ in range(FREE_PER_NAME):
        assert wait_of(limiter, "admin", "10.0.0.1") is None
    waits = []
    for _ in range(4):
        wait = wait_of(limiter, "admin", "10.0.0.1")
        assert wait is not None
        waits.append(wait)
        clock.now += wait
        assert wait_of(limiter, "admin", "10.0.0.1") is None  # let in once it waited
    assert waits == [1, 2, 4, 8]
    clock.now += 16
    succeed(limiter, "admin", "10.0.0.1")
    limiter.begin("admin", "10.0.0.9").forgive()  # another address was never held back


def test_failures_from_one_address_never_hold_back_another(limiter: LoginLimiter) -> None:
    for _ in range(50):
        wait_of(limiter, "admin", "10.0.0.1")
    assert wait_of(limiter, "admin", "10.0.0.1") is not None
    limiter.begin("admin", "10.0.0.2")
    for _ in range(50):
        wait_of(limiter, None, "10.0.0.3")  # token guesses
    assert wait_of(limiter, None, "10.0.0.3") is not None
    assert wait_of(limiter, None, "10.0.0.4") is None


def test_an_address_that_logged_a_user_in_is_never_held_back_for_them(
    limiter: LoginLimiter
) -> None:
    succeed(limiter, "admin", "10.0.0.1")
    for _ in range(FREE_PER_ADDRESS * 2):
        assert wait_of(limiter, "admin", "10.0.0.1") is None  # someone behind the same NAT
    for _ in range(FREE_PER_NAME):
        wait_of(limiter, "mallory", "10.0.0.1")
    assert wait_of(limiter, "mallory", "10.0.0.1") is not None  # not for other names


def test_a_trusted_login_gives_back_no_failure_it_did_not_count(limiter: LoginLimiter) -> None:
    succeed(limiter, "mallory", "10.0.0.1")
    for number in range(FREE_PER_ADDRESS):  # sprayed names, each login of mallory between
        fail(limiter, f"user{number}", "10.0.0.1")
        succeed(limiter, "mallory", "10.0.0.1")
    assert wait_of(limiter, "yet-another", "10.0.0.1") == 1


def test_one_address_spraying_names_is_slowed_per_address(limiter: LoginLimiter) -> None:
    for number in range(FREE_PER_ADDRESS):
        assert wait_of(limiter, f"user{number}", "10.0.0.1") is None
    refused = wait_of(limiter, "yet-another", "10.0.0.1")
    assert refused == 1
    assert wait_of(limiter, "yet-another", "10.0.0.2") is None


def test_failures_age_out_and_a_login_without_a_verdict_is_forgiven(
    limiter: LoginLimiter, clock: Clock
) -> None:
    for _ in range(FREE_PER_NAME):
        limiter.begin("admin", "10.0.0.1").forgive()  # the server was busy: no verdict
    assert wait_of(limiter, "admin", "10.0.0.1") is None
    for _ in range(30):
        wait_of(limiter, "admin", "10.0.0.1")
        clock.now += 1
    assert wait_of(limiter, "admin", "10.0.0.1") is not None
    clock.now += 901
    assert wait_of(limiter, "admin", "10.0.0.1") is None


def test_memory_is_bounded_oldest_forgotten_first(clock: Clock) -> None:
    limiter = LoginLimiter(clock=clock, max_keys=10, per_address=1000)
    for _ in range(FREE_PER_NAME):
        fail(limiter, "admin", "10.0.0.1")
    assert wait_of(limiter, "admin", "10.0.0.1") is not None
    for number in range(20):
        fail(limiter, f"user{number}", "10.0.0.2")
    assert len(limiter._tallies) <= 10
    assert wait_of(limiter, "admin", "10.0.0.1") is None  # forgotten, as the oldest


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        LoginLimiter(window_s=10, max_delay_s=300)
    with pytest.raises(ValueError, match="per_name=0"):
        LoginLimiter(per_name=0)


def test_trusted_proxies_must_be_addresses_or_networks() -> None:
    assert trusted_proxies(["127.0.0.1", "10.0.0.0/8", "::1"]) == [
        "127.0.0.1", "10.0.0.0/8", "::1"]
    with pytest.raises(ConfigError, match=r"trusted_proxies: 'proxy\.lan' is no IP address"):
        trusted_proxies(["proxy.lan"])
