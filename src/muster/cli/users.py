"""`muster user create | list | edit | deactivate | activate` (admins), `muster whoami`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.errors import InvalidRequest

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="Users and their roles (admin, user, viewer).", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)

RoleOption = Annotated[str, typer.Option(
    "--role", help="admin (everything), user (its own experiments) or viewer (reads only)")]
PasswordStdin = Annotated[bool, typer.Option(
    "--password-stdin", help="read a password (for the web UI) from the first line of stdin")]
UnixUser = Annotated[str | None, typer.Option(
    "--unix-user", help="the Unix account its jobs run as under the cluster config's "
    "`run_as: owner` (default: the account named like the user)")]


@app.command()
def create(
    name: str,
    role: RoleOption = "user",
    display_name: Annotated[str, typer.Option(help="a full name, shown in the UI")] = "",
    password_stdin: PasswordStdin = False,
    unix_user: UnixUser = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Create a user (admins only); prints their first API token, shown this once."""
    password = read_password_stdin() if password_stdin else None
    with client(home, url) as c:
        made = c.create_user(name, role, display_name=display_name, password=password,
                             unix_user=unix_user)
    if as_json:
        render.print_json(made)
        return
    render.err_console.print(f"created {made['role']} {made['name']}; their API token "
                             "(shown once; give it to them, e.g. as MUSTER_TOKEN):",
                             markup=False)
    print(made["token"])


@app.command("list")
def list_(as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """List the users, their roles and when each was last seen."""
    with client(home, url) as c:
        rows = c.list_users()
    if as_json:
        render.print_json(rows)
        return
    table = Table("Name", "Display name", "Role", "Active", "Password", "Unix account",
                  "Created", "Last seen")
    for user in rows:
        table.add_row(escape(user["name"]), escape(user["display_name"]) or "-", user["role"],
                      "yes" if user["active"] else "[red]no[/]",
                      "yes" if user["has_password"] else "-",
                      escape(user["unix_user"] or "-"), render.when(user["created_at"]),
                      render.when(user["last_seen_at"]))
    render.console.print(table)


@app.command()
def edit(
    name: str,
    role: Annotated[str | None, typer.Option(help="admin, user or viewer (admins only)")] = None,
    display_name: Annotated[str | None, typer.Option(help="a full name")] = None,
    password_stdin: PasswordStdin = False,
    unix_user: UnixUser = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Change a user: an admin anything, anyone their own display name and password (the
    new password on stdin's first line; for your own, the current one on the second)."""
    change: dict[str, str | None] = {"role": role, "display_name": display_name,
                                     "unix_user": unix_user}
    if password_stdin:
        lines = sys.stdin.read().splitlines()
        if not lines or not lines[0]:
            raise InvalidRequest("--password-stdin: the first line of stdin is empty")
        change["password"] = lines[0]
        change["current_password"] = lines[1] if len(lines) > 1 and lines[1] else None
    with client(home, url) as c:
        user = c.edit_user(name, **change)
    _report(user, as_json, "changed")


@app.command()
def deactivate(name: str, as_json: JsonOption = False, home: HomeOption = None,
               url: UrlOption = None) -> None:
    """Deactivate a user: their tokens stop working at once; their experiments run on."""
    with client(home, url) as c:
        user = c.deactivate_user(name)
    _report(user, as_json, "deactivated")


@app.command()
def activate(name: str, as_json: JsonOption = False, home: HomeOption = None,
             url: UrlOption = None) -> None:
    """Let a deactivated user in again."""
    with client(home, url) as c:
        user = c.activate_user(name)
    _report(user, as_json, "activated")


def _report(user: api.UserView, as_json: bool, verb: str) -> None:
    if as_json:
        render.print_json(user)
        return
    render.console.print(f"{user['name']} {verb}: {user['role']}, "
                         f"{'active' if user['active'] else 'deactivated'}", markup=False)


def read_password_stdin() -> str:
    """The first line of stdin, as a password."""
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise InvalidRequest("--password-stdin: the first line of stdin is empty")
    return password


def whoami(as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None
           ) -> None:
    """Show who your token acts as: user name, role, and the token's id."""
    with client(home, url) as c:
        me = c.whoami()
        server = c.url
    if as_json:
        render.print_json(me)
        return
    render.console.print(f"{me['name']} ({me['role']}) at {server}, token {me['token_id']}",
                         markup=False)
