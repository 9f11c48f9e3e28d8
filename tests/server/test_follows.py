"""`FollowLimit` on its own: places per key, refused past the limit, given back once."""

from __future__ import annotations

import pytest

from muster.errors import TooManyRequests
from muster.server.follows import RETRY_AFTER_SECONDS, FollowLimit


def test_each_key_has_its_own_places_and_a_release_counts_once() -> None:
    limit = FollowLimit(limit=2)
    first, _ = limit.take("a"), limit.take("a")
    other = limit.take("b")  # another token is not refused for "a"'s follows
    refusal = r"2 streams \(log follows and live pages\) already open"
    with pytest.raises(TooManyRequests, match=refusal) as refused:
        limit.take("a")
    assert refused.value.retry_after == RETRY_AFTER_SECONDS
    first.release()
    first.release()  # a second release gives nothing more back
    limit.take("a")
    with pytest.raises(TooManyRequests):
        limit.take("a")
    other.release()
    limit.take("b")


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1, but got limit=0"):
        FollowLimit(limit=0)
