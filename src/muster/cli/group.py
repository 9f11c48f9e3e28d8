"""`muster group list | describe | create | delete | add-user | remove-user` (as
Determined's `det user-group`): groups of users, whose quotas hold their members together."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="Groups of users (admins manage them); a group's quota holds its "
                  "members together.", no_args_is_help=True, rich_markup_mode=None,
                  add_completion=False)

Users = Annotated[list[str], typer.Argument(help="user names")]


@app.command("list")
def list_(as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """List the groups and their members."""
    with client(home, url) as c:
        groups = c.list_groups()
    if as_json:
        render.print_json(groups)
        return
    table = Table("Group", "Description", "Members")
    for group in groups:
        table.add_row(escape(group["name"]), escape(group["description"]) or "-",
                      escape(", ".join(group["members"])) or "-")
    render.console.print(table)


@app.command()
def describe(name: str, as_json: JsonOption = False, home: HomeOption = None,
             url: UrlOption = None) -> None:
    """Show a group's members."""
    with client(home, url) as c:
        group = c.get_group(name)
    _report(group, as_json)


@app.command()
def create(name: str,
           description: Annotated[str, typer.Option(help="what the group is for")] = "",
           as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Create an empty group (admins)."""
    with client(home, url) as c:
        group = c.create_group(name, description)
    _report(group, as_json)


@app.command()
def delete(name: str, as_json: JsonOption = False, home: HomeOption = None,
           url: UrlOption = None) -> None:
    """Delete a group, its memberships and the limits set for it at runtime (admins)."""
    with client(home, url) as c:
        group = c.delete_group(name)
    if as_json:
        render.print_json(group)
        return
    render.console.print(f"group {group['name']} deleted", markup=False)


@app.command("add-user")
def add_user(name: str, users: Users, as_json: JsonOption = False, home: HomeOption = None,
             url: UrlOption = None) -> None:
    """Add users to a group (admins)."""
    with client(home, url) as c:
        group = c.add_group_members(name, users)
    _report(group, as_json)


@app.command("remove-user")
def remove_user(name: str, users: Users, as_json: JsonOption = False,
                home: HomeOption = None, url: UrlOption = None) -> None:
    """Remove users from a group (admins)."""
    with client(home, url) as c:
        group = None
        for user in users:
            group = c.remove_group_member(name, user)
    assert group is not None, "typer asks for at least one user"
    _report(group, as_json)


def _report(group: api.GroupView, as_json: bool) -> None:
    if as_json:
        render.print_json(group)
        return
    members = ", ".join(group["members"]) or "no members"
    render.console.print(f"group {group['name']}: {members}", markup=False)
