"""`muster token create | list | revoke`, `muster login` and `muster logout`."""

from __future__ import annotations

import getpass
import socket
import sys
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from muster.cli import render
from muster.cli.options import HomeOption, JsonOption, UrlOption, client
from muster.cli.users import read_password_stdin
from muster.client import Client
from muster.errors import InvalidRequest, MusterError
from muster.home import Home

app = typer.Typer(help="Your API tokens.", no_args_is_help=True,
                  rich_markup_mode=None, add_completion=False)


@app.command()
def create(
    name: Annotated[str, typer.Option("--name", help="what it is for, e.g. laptop")] = "api token",
    expires: Annotated[str | None, typer.Option(
        help="when it stops working: 30d, 12h (default: never)")] = None,
    user: Annotated[str | None, typer.Option(
        help="an admin makes it for this user (e.g. a service account)")] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Make an API token; it is printed this once (the server keeps only its hash)."""
    with client(home, url) as c:
        made = c.create_token(name, expires, user)
    if as_json:
        render.print_json(made)
        return
    expires_at = render.when(made["expires_at"]) if made["expires_at"] else "never"
    render.err_console.print(f"token {made['id']} ({made['name']}) of {made['user']}, "
                             f"expires {expires_at}; shown once:", markup=False)
    print(made["token"])


@app.command("list")
def list_(
    user: Annotated[str | None, typer.Option(help="an admin lists this user's")] = None,
    as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None,
) -> None:
    """List your API tokens that are not revoked (never the tokens themselves)."""
    with client(home, url) as c:
        rows = c.list_tokens(user)
    if as_json:
        render.print_json(rows)
        return
    table = Table("ID", "Name", "User", "Created", "Expires", "Last used")
    for row in rows:
        expires = render.when(row["expires_at"]) if row["expires_at"] else "never"
        table.add_row(row["id"], escape(row["name"]), escape(row["user"]),
                      render.when(row["created_at"]),
                      f"[red]{expires} (expired)[/]" if row["expired"] else expires,
                      render.when(row["last_used_at"]))
    render.console.print(table)


@app.command()
def revoke(token_id: Annotated[str, typer.Argument(metavar="ID")],
           as_json: JsonOption = False, home: HomeOption = None, url: UrlOption = None
           ) -> None:
    """Revoke a token (yours; an admin: anyone's): it stops working at once."""
    with client(home, url) as c:
        row = c.revoke_token(token_id)
    if as_json:
        render.print_json(row)
        return
    render.console.print(f"token {row['id']} ({row['name']}) of {row['user']} revoked",
                         markup=False)


def login(
    server: Annotated[str | None, typer.Argument(
        metavar="[URL]", help="the server (default: MUSTER_URL or this home's server)")] = None,
    user: Annotated[str | None, typer.Option(help="your muster user name")] = None,
    password_stdin: Annotated[bool, typer.Option(
        "--password-stdin", help="read the password from stdin's first line")] = False,
    token_stdin: Annotated[bool, typer.Option(
        "--token-stdin", help="keep an API token you have (stdin's first line) instead")] = False,
    expires: Annotated[str | None, typer.Option(
        help="when the new token stops working: 90d (default: never)")] = None,
    home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Log in to a server: make an API token with your password (or take one you have) and
    keep it for that URL in ~/.config/muster/credentials (0600)."""
    with Client(url=server or url, home=Home.resolve(home)) as c:
        if token_stdin:
            token = sys.stdin.readline().strip()
            if not token:
                raise InvalidRequest("--token-stdin: the first line of stdin is empty")
        else:
            name = user or _ask("muster user: ")
            password = read_password_stdin() if password_stdin else getpass.getpass(
                f"password for {name} at {c.url}: ")
            token = c.login_token(name, password, f"muster login from {socket.gethostname()}",
                                  expires)["token"]
        with Client(url=c.url, token=token, home=c.home) as check:
            me = check.whoami()
        c.credentials.keep(c.url, token, me["name"])
    render.console.print(f"logged in to {c.url} as {me['name']} ({me['role']}); token kept in "
                         f"{c.credentials.path}", markup=False)


def logout(
    server: Annotated[str | None, typer.Argument(metavar="[URL]")] = None,
    home: HomeOption = None, url: UrlOption = None,
) -> None:
    """Revoke the token `muster login` kept for a server, and forget it."""
    with Client(url=server or url, home=Home.resolve(home)) as c:
        token = c.credentials.token_for(c.url)
        if token is None:
            render.console.print(f"no token kept for {c.url}", markup=False)
            return
        with Client(url=c.url, token=token, home=c.home) as kept:
            try:
                _revoke(kept)
            except MusterError as exc:  # revoked or expired already: forget it all the same
                render.err_console.print(f"the kept token was not revoked: {exc}",
                                         markup=False)
        c.credentials.forget(c.url)
    render.console.print(f"logged out of {c.url}", markup=False)


def _revoke(kept: Client) -> None:
    """Revoke the token `kept` calls with."""
    token_id = kept.whoami()["token_id"]
    if token_id is None:  # only a web session has none, and a client sends a token
        raise MusterError(f"{kept.url} did not say which token it was sent")
    kept.revoke_token(token_id)


def _ask(prompt: str) -> str:
    if not sys.stdin.isatty():
        raise InvalidRequest("give --user NAME (stdin is not a terminal to ask on)")
    return input(prompt).strip()
