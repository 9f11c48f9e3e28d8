"""Users for tests that call the services directly: real rows, and the principal of each."""

from __future__ import annotations

from muster.home import Home
from muster.services.access import Principal
from muster.services.users import bootstrap, principal
from muster.states import Role
from muster.store import Store, User


def first_admin(store: Store, home: Home) -> Principal:
    """The admin a server makes on its first start (and its token in the home)."""
    return principal(store, bootstrap(store, home.token_path))


def add_user(store: Store, name: str, role: Role = Role.USER) -> Principal:
    """A user row (no token), and its principal."""
    with store.session_scope() as s:
        user = User(name=name, role=role.value)
        s.add(user)
        s.flush()
        return Principal(user_id=user.id, name=name, role=role)
