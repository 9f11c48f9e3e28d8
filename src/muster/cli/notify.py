"""`muster notify add | list | remove | log`: your notifications (docs/how-to/team.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.states import NotificationKind

app = typer.Typer(help="Be told when your experiments end, fail, stall or await review.",
                  no_args_is_help=True, rich_markup_mode=None, add_completion=False)

_KINDS = ", ".join(k.value for k in NotificationKind)


def _events(text: str | None) -> list[str] | None:
    """`--events a,b` as its words (the server says which are none)."""
    return None if text is None else [w.strip() for w in text.split(",") if w.strip()]


@app.command()
def add(
    target: Annotated[str, typer.Argument(
        metavar="URL", help="https://… (muster's signed webhook) or an Apprise URL: "
        "slack://…, msteams://…, discord://…")],
    events: Annotated[str | None, typer.Option(
        help=f"comma-separated, some of: {_KINDS} (default: all)")] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Be told of your experiments' and models' events at URL. A webhook's signing key is
    printed this once: the receiver checks each delivery's Muster-Signature with it."""
    with client(home, url) as c:
        made = c.add_notification(target, _events(events))
    if as_json:
        render.print_json(made)
        return
    render.console.print(f"notification {made['id']} to {made['url']} for "
                         f"{', '.join(made['events'])}", markup=False)
    if made["secret"] is not None:
        render.err_console.print("its signing key (HMAC-SHA256 of the Muster-Signature "
                                 "header), shown once:", markup=False)
        print(made["secret"])


@app.command("list")
def list_(
    everyone: Annotated[bool, typer.Option("--all", help="an admin lists everyone's")] = False,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List your notification subscriptions (their URLs shown as scheme and host)."""
    with client(home, url) as c:
        rows = c.list_notifications(everyone)
    if as_json:
        render.print_json(rows)
        return
    table = Table("ID", "User", "URL", "Events", "Signed", "Added")
    for row in rows:
        table.add_row(str(row["id"]), escape(row["user"]), escape(row["url"]),
                      escape(", ".join(row["events"])), "yes" if row["signed"] else "no",
                      render.when(row["created_at"]))
    render.console.print(table)


@app.command()
def remove(subscription_id: Annotated[int, typer.Argument(metavar="ID", min=1)],
           as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None
           ) -> None:
    """Remove a subscription (yours; an admin: anyone's)."""
    with client(home, url) as c:
        row = c.remove_notification(subscription_id)
    if as_json:
        render.print_json(row)
        return
    render.console.print(f"notification {row['id']} to {row['url']} of {row['user']} removed",
                         markup=False)


@app.command()
def log(
    limit: Annotated[int, typer.Option(min=1, max=500, help="how many, newest first")] = 50,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """The latest notifications and how their delivery went (an admin: every target's)."""
    with client(home, url) as c:
        rows = c.notification_log(limit)
    if as_json:
        render.print_json(rows)
        return
    table = Table("ID", "Event", "Kind", "To", "State", "Tries", "Created", "Last error")
    for row in rows:
        table.add_row(str(row["id"]), str(row["event_id"]), row["kind"],
                      escape(row["url"] or row["target"]), row["state"], str(row["tries"]),
                      render.when(row["created_at"]), escape(row["last_error"] or ""))
    render.console.print(table)
