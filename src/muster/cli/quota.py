"""`muster quota list | show | set | clear`: limits per user, per group and by default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.errors import InvalidRequest

if TYPE_CHECKING:
    from muster import api

app = typer.Typer(help="Quotas: what each user and group may hold at once.",
                  no_args_is_help=True, rich_markup_mode=None, add_completion=False)

_VALUE_HELP = "a count (0 allows none), or `none` for no limit"
UserOption = Annotated[str | None, typer.Option("--user", help="a user's own quota")]
GroupOption = Annotated[str | None, typer.Option(
    "--group", help="a group's quota, which its members share (muster group)")]
DefaultOption = Annotated[bool, typer.Option(
    "--default", help="the default: each user's own where nothing more specific names it")]
Value = Annotated[str | None, typer.Option(help=_VALUE_HELP, metavar="N")]
NO_LIMIT = ("none", "unlimited")


@app.command("list")
def list_(as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Show every quota (the default, users', groups'), what its users hold now, and where
    each limit comes from (an admin's, or the cluster config's)."""
    with client(home, url) as c:
        views = c.list_quotas()
    if as_json:
        render.print_json(views)
    elif not views:
        render.err_console.print("no quota limits anything (cluster config `quotas`, or "
                                 "muster quota set)")
    else:
        render.console.print(quotas_table(views))


@app.command()
def show(user: Annotated[str | None, typer.Argument(help="a user (default: you)")] = None,
         as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Show what a user is held to: their own quota and each of their groups', with what
    is in use."""
    with client(home, url) as c:
        name = user if user is not None else c.whoami()["name"]
        held = c.user_quotas(name)
    if as_json:
        render.print_json(held)
        return
    groups = ", ".join(held["groups"]) or "none"
    render.console.print(f"{held['user']} (groups: {groups})", markup=False)
    if held["quotas"]:
        render.console.print(quotas_table(held["quotas"]))
    else:
        render.console.print("no quota limits them", markup=False)


@app.command("set")
def set_(user: UserOption = None, group: GroupOption = None, default: DefaultOption = False,
         max_slots: Value = None, max_gpus: Value = None, max_running_trials: Value = None,
         max_queued_trials: Value = None,
         as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Set limits at runtime (admins): they win over the cluster config's for that user,
    group or default, and the next supervisor pass admits by them. Limits not named keep
    what they are; `none` lifts one."""
    subject, name = _subject(user, group, default)
    given = {"max_slots": max_slots, "max_gpus": max_gpus,
             "max_running_trials": max_running_trials, "max_queued_trials": max_queued_trials}
    limits = {key: _value(key, text) for key, text in given.items() if text is not None}
    if not limits:
        raise InvalidRequest("name a limit to set: --max-slots, --max-gpus, "
                             "--max-running-trials or --max-queued-trials")
    with client(home, url) as c:
        view = c.set_quota(subject, name, limits)
    _report(view, as_json)


@app.command()
def clear(user: UserOption = None, group: GroupOption = None, default: DefaultOption = False,
          limit: Annotated[list[str] | None, typer.Option(
              help="a limit to clear (max-gpus, ...; repeat it); default: all of them")] = None,
          as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """Clear limits set at runtime (admins), so that the cluster config's apply again."""
    subject, name = _subject(user, group, default)
    limits = [word.replace("-", "_") for word in limit or ()]
    with client(home, url) as c:
        view = c.clear_quota(subject, name, limits)
    _report(view, as_json)


def quotas_table(views: list[api.QuotaView]) -> Table:
    """One row per quota: whose, its limits (and where each comes from), what is in use."""
    table = Table("Quota", "In use / limit", "Limits from")
    for view in views:
        sources = sorted({limit["source"] for limit in view["limits"]})
        table.add_row(escape(holder(view)), escape(view["summary"]),
                      escape(", ".join(sources)))
    return table


def holder(view: api.QuotaView) -> str:
    """"alice's quota", "group vision's quota (alice, bob)", "the default quota"."""
    if view["subject"] == "default":
        return "the default quota"
    if view["subject"] == "group":
        members = f" ({', '.join(view['members'])})" if view["members"] else ""
        return f"group {view['name']}'s quota{members}"
    return f"{view['name']}'s quota"


def _subject(user: str | None, group: str | None, default: bool) -> tuple[str, str | None]:
    named: list[tuple[str, str | None]] = [
        (s, n) for s, n in (("user", user), ("group", group)) if n is not None]
    if default:
        named.append(("default", None))
    if len(named) != 1:
        raise InvalidRequest("name exactly one of --user NAME, --group NAME or --default")
    return named[0]


def _value(key: str, text: str) -> int | None:
    if text.strip().lower() in NO_LIMIT:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidRequest(f"--{key.replace('_', '-')} must be {_VALUE_HELP}, got {text!r}")
    return value


def _report(view: api.QuotaView, as_json: bool) -> None:
    if as_json:
        render.print_json(view)
        return
    render.console.print(f"{holder(view)}: {view['summary'] or 'no limits'}", markup=False)
