"""What a running server holds."""

from __future__ import annotations

from dataclasses import dataclass, field

from muster.home import Home
from muster.server.event_feed import EventFeed
from muster.server.follows import FollowLimit
from muster.server.log_watch import LogWatch
from muster.server.login_limit import LoginLimiter
from muster.server.orchestrator import Orchestrator
from muster.server.platform import Platform
from muster.services.evidence import DumpsInFlight
from muster.store import Store


@dataclass
class ServerState:
    """What the routes reach through `request.app.state.muster`: the platform, the
    orchestrator of its passes, and what the server keeps per client."""

    platform: Platform
    orchestrator: Orchestrator
    follows: FollowLimit = field(default_factory=FollowLimit)  # open log follows per user
    log_watch: LogWatch = field(default_factory=LogWatch)  # wakes them when a log is written
    logins: LoginLimiter = field(default_factory=LoginLimiter)  # failed logins
    dumps: DumpsInFlight = field(default_factory=DumpsInFlight)  # one per trial at a time
    feed: EventFeed = field(init=False)  # the newest event id, for the event streams

    def __post_init__(self) -> None:
        self.feed = EventFeed(self.platform.store)

    @property
    def store(self) -> Store:
        return self.platform.store

    def wake_drills(self) -> None:
        """A drill was made or changed: the drill thread looks now."""
        if self.platform.drills is not None:
            self.platform.drills.wake()

    @property
    def home(self) -> Home:
        return self.platform.home
