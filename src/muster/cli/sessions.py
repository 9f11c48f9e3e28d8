"""`muster session list | end`: web sessions (the UI's logins), yours or, for an admin,
anyone's."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client

app = typer.Typer(help="Your web sessions (the web UI's logins).", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)


@app.command("list")
def list_(
    user: Annotated[str | None, typer.Option(help="an admin lists this user's")] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List your open web sessions: when and where each was opened, and with what."""
    with client(home, url) as c:
        rows = c.list_sessions(user)
    if as_json:
        render.print_json(rows)
        return
    table = Table("ID", "User", "Opened", "From", "With", "Expires", "Last used")
    for row in rows:
        opened_with = (f"token {row['opened_with']} ({escape(row['opened_with_name'] or '')})"
                       if row["opened_with"] else "password")
        table.add_row(row["id"] + (" (this one)" if row["current"] else ""),
                      escape(row["user"]), render.when(row["created_at"]),
                      escape(row["address"] or "-"), opened_with,
                      render.when(row["expires_at"]), render.when(row["last_used_at"]))
    render.console.print(table)


@app.command()
def end(session_id: Annotated[str, typer.Argument(metavar="ID")],
        as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None) -> None:
    """End a web session (yours; an admin: anyone's): its browser is logged out at once."""
    with client(home, url) as c:
        row = c.end_session(session_id)
    if as_json:
        render.print_json(row)
        return
    render.console.print(f"web session {row['id']} of {row['user']} ended", markup=False)
