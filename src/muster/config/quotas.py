"""The cluster config's `quotas`: limits per user, per group, and for every other user.

```yaml
quotas:
  default: {max_gpus: 2, max_queued_trials: 50}    # each user without a limit of their own
  users:
    alice: {max_gpus: 8, max_running_trials: 4}
    lead: {max_gpus: null}                         # null: no limit (the default's is lifted)
  groups:
    vision: {max_gpus: 16}                         # the members of `muster group` vision,
                                                   # together
```

A limit left out falls through (a user's to the default); an admin's runtime limit
(`muster quota set`) wins over this file's for the same user, group or default and limit
(`muster.schedule.quotas` resolves them). Names are checked like user names; a user or group
named here that does not exist holds nobody to anything, and `muster quota list` says so.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from muster.config.schema import _Section
from muster.states import QuotaLimit

__all__ = ["MAX_QUOTA_ENTRIES", "MAX_QUOTA_VALUE", "QuotaLimitsConfig", "QuotasConfig"]

MAX_QUOTA_ENTRIES = 10_000  # users (and groups) the config may name
MAX_QUOTA_VALUE = 1_000_000  # any larger limit is no limit: write null
_NAME = r"^[a-z_][a-z0-9_.-]{0,31}$"  # a user's or group's name (`muster user create`)
Limit = Annotated[int | None, Field(ge=0, le=MAX_QUOTA_VALUE)]


def _name(value: str) -> str:
    if not re.fullmatch(_NAME, value):
        raise ValueError(f"{value!r} is not a user's or group's name: a lowercase letter or "
                         "'_' first, then a-z, 0-9, '_', '.', '-', at most 32 characters")
    return value


Name = Annotated[str, AfterValidator(_name)]


class QuotaLimitsConfig(_Section):
    """The limits of one user, one group, or the default: each a count (0 allows none), or
    null for no limit; a key left out is not set here."""

    max_slots: Limit = None
    max_gpus: Limit = None
    max_running_trials: Limit = None
    max_queued_trials: Limit = None

    def declared(self) -> dict[QuotaLimit, int | None]:
        """The limits this entry names (null ones too: "no limit" is a value)."""
        return {QuotaLimit(key): getattr(self, key) for key in sorted(self.model_fields_set)}


class QuotasConfig(_Section):
    """`quotas:`: per user, per group (its members together), and the default of every user
    who has no limit of their own."""

    default: QuotaLimitsConfig = Field(default_factory=QuotaLimitsConfig)
    users: dict[Name, QuotaLimitsConfig] = Field(default_factory=dict,
                                                 max_length=MAX_QUOTA_ENTRIES)
    groups: dict[Name, QuotaLimitsConfig] = Field(default_factory=dict,
                                                  max_length=MAX_QUOTA_ENTRIES)

    @property
    def empty(self) -> bool:
        """Nothing is limited here."""
        return not (self.default.model_fields_set or self.users or self.groups)
