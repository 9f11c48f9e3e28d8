"""Users, tokens and the first start, through the services, on SQLite and PostgreSQL."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from muster.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from muster.home import Home
from muster.services import tokens, users
from muster.services.access import Principal
from muster.states import Role, TokenKind
from muster.store import ApiToken, Event, Experiment, Store, User
from tests.accounts import first_admin


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home").ensure()


def make_user(store: Store, admin: Principal, name: str, role: Role = Role.USER,
              password: str | None = None) -> tuple[Principal, str]:
    """A user made by `admin` through the service: (their principal, their first token)."""
    made = users.create_user(store, admin, name, role, password=password)
    return tokens.authenticate(store, made["token"], TokenKind.API), made["token"]


def every_text_in(store: Store) -> str:
    """Every value of every row of every table, as one text."""
    with store.engine.connect() as connection:
        names = [row[0] for row in connection.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            if store.engine.dialect.name == "postgresql" else
            "SELECT name FROM sqlite_master WHERE type = 'table'"))]
        return "\n".join(str(tuple(row)) for name in names
                         for row in connection.execute(text(f'SELECT * FROM "{name}"')))


# -- the first start ---------------------------------------------------------------------


def test_the_first_start_makes_an_admin_and_a_token_file_only_they_read(
    store: Store, home: Home
) -> None:
    admin = first_admin(store, home)
    assert (admin.name, admin.role) == ("admin", Role.ADMIN)
    secret = home.token_path.read_text().strip()
    assert secret.startswith("mst_") and len(secret) > 40
    assert stat.S_IMODE(home.token_path.stat().st_mode) == 0o600
    assert tokens.authenticate(store, secret, TokenKind.API).name == "admin"
    assert users.bootstrap(store, home.token_path) == "admin"  # the next start: the same
    assert home.token_path.read_text().strip() == secret
    with store.session_scope() as s:
        assert s.scalar(select(User.name)) == "admin"
        assert len(s.scalars(select(ApiToken)).all()) == 1


def test_the_database_holds_no_usable_token(store: Store, home: Home) -> None:
    admin = first_admin(store, home)
    _, alice_token = make_user(store, admin, "alice")
    made = tokens.create_api_token(store, admin, "laptop", None)
    dump = every_text_in(store)
    for secret in (home.token_path.read_text().strip(), alice_token, made["token"]):
        assert secret not in dump
        assert secret[4:] not in dump  # not even without its prefix
        assert tokens.hash_secret(secret) in dump  # what is there: its SHA-256


def test_a_token_from_before_users_is_adopted_and_experiments_get_an_owner(
    store: Store, home: Home
) -> None:
    legacy = "x" * 43  # token_urlsafe(32), as muster wrote it before users
    home.token_path.write_text(legacy + "\n")
    with store.session_scope() as s:
        s.add(Experiment(name="old", config={}, config_yaml="", context_dir="/tmp",
                         state="COMPLETED"))
    admin = first_admin(store, home)
    assert home.token_path.read_text().strip() == legacy  # clients keep working
    assert tokens.authenticate(store, legacy, TokenKind.API).name == admin.name
    with store.session_scope() as s:
        assert [e.owner_name for e in s.scalars(select(Experiment))] == ["admin"]
        first = s.scalars(select(Event).order_by(Event.id)).first()
        assert first is not None and first.actor == "system:server"
        assert "owner of the 1 experiments made before users" in (first.message or "")


def test_a_revoked_or_missing_home_token_is_made_anew_at_start(store: Store, home: Home) -> None:
    admin = first_admin(store, home)
    old = home.token_path.read_text().strip()
    tokens.revoke_token(store, admin, tokens.authenticate(store, old, TokenKind.API).token_id
                        or "")
    users.bootstrap(store, home.token_path)
    new = home.token_path.read_text().strip()
    assert new != old and tokens.authenticate(store, new, TokenKind.API).name == "admin"
    with pytest.raises(Unauthorized):
        tokens.authenticate(store, old, TokenKind.API)
    home.token_path.unlink()
    users.bootstrap(store, home.token_path)
    assert tokens.authenticate(store, home.token_path.read_text().strip(),
                               TokenKind.API).role is Role.ADMIN


# -- tokens ------------------------------------------------------------------------------


def test_revoked_expired_and_deactivated_tokens_are_refused_at_once(
    store: Store, home: Home
) -> None:
    admin = first_admin(store, home)
    alice, first = make_user(store, admin, "alice")
    spare = tokens.create_api_token(store, alice, "spare", None)
    short = tokens.create_api_token(store, alice, "short", 3600.0)
    assert short["expires_at"] is not None and not short["expired"]

    tokens.revoke_token(store, alice, spare["id"])
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        tokens.authenticate(store, spare["token"], TokenKind.API)

    with store.session_scope() as s:  # its hour is up
        s.execute(update(ApiToken).where(ApiToken.id == short["id"]).values(expires_at=1.0))
    with pytest.raises(Unauthorized, match=rf"token {short['id']} \(short\) has expired"):
        tokens.authenticate(store, short["token"], TokenKind.API)

    assert tokens.authenticate(store, first, TokenKind.API).name == "alice"
    users.deactivate_user(store, admin, "alice")
    with pytest.raises(Unauthorized, match="user alice is deactivated"):
        tokens.authenticate(store, first, TokenKind.API)
    users.activate_user(store, admin, "alice")
    assert tokens.authenticate(store, first, TokenKind.API).name == "alice"


def test_a_token_works_only_as_its_kind(store: Store, home: Home) -> None:
    admin = first_admin(store, home)
    make_user(store, admin, "vera", Role.VIEWER, password="correct horse")
    login = users.log_in(store, "vera", "correct horse")
    assert tokens.authenticate(store, login.secret, TokenKind.SESSION).via_session
    with pytest.raises(Unauthorized):
        tokens.authenticate(store, login.secret, TokenKind.API)
    with pytest.raises(Unauthorized):
        tokens.authenticate(store, home.token_path.read_text().strip(), TokenKind.SESSION)
    with pytest.raises(Unauthorized):
        tokens.authenticate(store, "mst_" + "a" * 300, TokenKind.API)


def test_tokens_are_listed_without_their_secret_and_only_one_s_own(
    store: Store, home: Home
) -> None:
    admin = first_admin(store, home)
    alice, _ = make_user(store, admin, "alice")
    bob, _ = make_user(store, admin, "bob")
    laptop = tokens.create_api_token(store, alice, "laptop", 30 * 86_400.0)
    listed = tokens.list_tokens(store, alice)
    assert [t["name"] for t in listed] == ["first token", "laptop"]
    assert all("token" not in t and t["user"] == "alice" for t in listed)
    assert set(listed[1]) == {"id", "name", "user", "created_at", "expires_at",
                              "last_used_at", "expired"}
    with pytest.raises(Forbidden, match="user bob cannot manage users"):
        tokens.list_tokens(store, bob, for_user="alice")
    with pytest.raises(NotFound, match=f"token {laptop['id']} is not one of yours"):
        tokens.revoke_token(store, bob, laptop["id"])
    assert [t["name"] for t in tokens.list_tokens(store, admin, for_user="alice")] == [
        "first token", "laptop"]
    tokens.revoke_token(store, admin, laptop["id"])  # an admin revokes anyone's
    assert [t["name"] for t in tokens.list_tokens(store, alice)] == ["first token"]


def test_a_service_account_s_token_is_an_admin_s_to_make(store: Store, home: Home) -> None:
    admin = first_admin(store, home)
    alice, _ = make_user(store, admin, "alice")
    make_user(store, admin, "ci-bot")
    made = tokens.create_api_token(store, admin, "ci", 90 * 86_400.0, for_user="ci-bot")
    assert tokens.authenticate(store, made["token"], TokenKind.API).name == "ci-bot"
    with pytest.raises(Forbidden):
        tokens.create_api_token(store, alice, "ci", None, for_user="ci-bot")
    with pytest.raises(InvalidRequest, match="expires must be more than 0 s"):
        tokens.create_api_token(store, alice, "x", 4000 * 86_400.0)


def test_a_user_holds_a_bounded_number_of_tokens_and_sessions(
    store: Store, home: Home
) -> None:
    admin = first_admin(store, home)
    alice, _ = make_user(store, admin, "alice")  # her first token
    for number in range(tokens.MAX_API_TOKENS - 1):
        tokens.create_api_token(store, alice, f"t{number}", None)
    with pytest.raises(Conflict, match="alice holds 100 API tokens, the most"):
        tokens.create_api_token(store, alice, "one more", None)
    opened = []
    with store.session_scope() as s:
        user = s.get_one(User, alice.user_id)
        for _ in range(tokens.MAX_SESSIONS + 5):
            opened.append(tokens.open_session(s, user)[1])
        s.execute(update(ApiToken).where(ApiToken.kind == "session",
                                         ApiToken.revoked_at.is_(None))
                  .values(expires_at=1.0).execution_options(synchronize_session=False))
        last = tokens.open_session(s, user)[1]
    with store.session_scope() as s:
        kept = s.scalars(select(ApiToken).where(ApiToken.kind == "session")).all()
        assert len(kept) == 1  # the ended ones are gone; only the newest is left
    assert tokens.authenticate(store, last, TokenKind.SESSION).name == "alice"
    with pytest.raises(Unauthorized):
        tokens.authenticate(store, opened[-1], TokenKind.SESSION)


# -- users -------------------------------------------------------------------------------


def test_only_admins_manage_users_and_the_last_admin_stays(store: Store, home: Home) -> None:
    admin = first_admin(store, home)
    alice, _ = make_user(store, admin, "alice")
    with pytest.raises(Forbidden, match="user alice cannot manage users"):
        users.create_user(store, alice, "mallory", Role.ADMIN)
    with pytest.raises(Forbidden):
        users.edit_user(store, alice, "alice", users.UserChange(role=Role.ADMIN))
    with pytest.raises(Conflict, match="user alice exists already"):
        users.create_user(store, admin, "alice", Role.USER)
    with pytest.raises(InvalidRequest, match="user name 'Al:ice' must be"):
        users.create_user(store, admin, "Al:ice", Role.USER)
    with pytest.raises(Forbidden, match="cannot deactivate yourself"):
        users.deactivate_user(store, admin, "admin")
    with pytest.raises(Conflict, match="admin is the only active admin"):
        users.edit_user(store, admin, "admin", users.UserChange(role=Role.USER))
    users.edit_user(store, admin, "alice", users.UserChange(role=Role.ADMIN))
    alice = tokens.authenticate(store, make_token(store, admin, "alice"), TokenKind.API)
    users.deactivate_user(store, alice, "admin")  # another admin may
    with pytest.raises(Conflict, match="alice is the only active admin"):
        users.edit_user(store, alice, "alice", users.UserChange(role=Role.VIEWER))
    with store.session_scope() as s:
        actors = [(e.actor, e.reason) for e in s.scalars(
            select(Event).where(Event.entity == "user").order_by(Event.id))]
    assert ("admin", "user changed") in actors and ("alice", "user deactivated") in actors


def make_token(store: Store, admin: Principal, name: str) -> str:
    return str(tokens.create_api_token(store, admin, "t", None, for_user=name)["token"])


def test_one_s_own_password_changes_only_with_the_current_one(
    store: Store, home: Home
) -> None:
    admin = first_admin(store, home)
    alice, _ = make_user(store, admin, "alice", password="first password")
    change = users.UserChange(password="second password", current_password="wrong one!")
    with pytest.raises(Forbidden, match="is not your current password"):
        users.edit_user(store, alice, "alice", change)
    with pytest.raises(Forbidden, match="give your current one too"):
        users.edit_user(store, alice, "alice", users.UserChange(password="second password"))
    users.edit_user(store, alice, "alice", users.UserChange(
        password="second password", current_password="first password"))
    assert users.log_in(store, "alice", "second password").principal.name == "alice"
    # An admin sets it without the old one.
    users.edit_user(store, admin, "alice", users.UserChange(password="third password"))
    with pytest.raises(Unauthorized, match="wrong user name or password"):
        users.log_in(store, "alice", "second password")
    with pytest.raises(InvalidRequest, match="a password must be 8 to 1024 characters"):
        users.edit_user(store, admin, "alice", users.UserChange(password="short"))


def test_a_login_says_the_same_for_every_wrong_guess(store: Store, home: Home) -> None:
    admin = first_admin(store, home)
    make_user(store, admin, "alice", password="right password")
    make_user(store, admin, "tokenonly")
    for name, password in (("alice", "wrong password"), ("nobody", "right password"),
                           ("tokenonly", "anything at all"), ("Bad Name", "x")):
        with pytest.raises(Unauthorized, match=r"^wrong user name or password$"):
            users.log_in(store, name, password)
    users.deactivate_user(store, admin, "alice")
    with pytest.raises(Unauthorized, match="user alice is deactivated"):
        users.log_in(store, "alice", "right password")
