"""`muster trial logs ID --grep PATTERN`: the server searches each log, this prints the
matching lines as grep does.

Each attempt (or only `--attempt`'s) and each of its ranks (or only `--rank`'s) is searched
on the server (`GET /trials/{id}/logs/search`), page after page until complete, and every
matching line is printed once. Exit status as grep's: 0 when a line matched, 1 when none
did, 2 on an error (the caller's, `muster.cli.trial.logs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from muster.cli.follow import attempts_of

if TYPE_CHECKING:
    from muster import api
    from muster.client import Client

Write = Callable[[str], None]
PAGE_MATCHES = 1000  # the server's most (`muster.services.log_search.MAX_MATCHES`)


@dataclass(frozen=True)
class GrepRequest:
    """What to find, where, and how to print it."""

    pattern: str
    regex: bool = False
    ignore_case: bool = False
    attempt: int | None = None
    rank: int | None = None
    max_count: int | None = None  # matching lines to print, in all
    byte_offset: bool = False  # print each line's byte offset in its log before it


def grep_trial_logs(client: Client, trial_id: int, request: GrepRequest, out: Write) -> int:
    """Print the trial's matching lines; how many were printed."""
    numbers = ([request.attempt] if request.attempt is not None
               else [a["number"] for a in attempts_of(client.get_trial(trial_id))])
    printed = 0
    for number in numbers:
        for rank, match, several in _matches(client, trial_id, request, number):
            if request.max_count is not None and printed >= request.max_count:
                return printed
            out(_line(match, f"attempt {number} rank {rank}:" if several or len(numbers) > 1
                      else "", request.byte_offset))
            printed += 1
    return printed


def _matches(client: Client, trial_id: int, request: GrepRequest, attempt: int
             ) -> Iterator[tuple[int, api.LogMatch, bool]]:
    """(rank, first match of a line, whether several ranks are searched) for each matching
    line of the attempt's ranks."""
    first = client.search_logs(trial_id, request.pattern, regex=request.regex,
                               ignore_case=request.ignore_case, attempt=attempt,
                               rank=request.rank, limit=PAGE_MATCHES)
    ranks = [first["rank"]] if request.rank is not None else first["ranks"] or [first["rank"]]
    for rank in ranks:
        page = first if rank == first["rank"] else None
        for match in _lines(_pages(client, trial_id, request, attempt, rank, page)):
            yield rank, match, len(ranks) > 1


def _pages(client: Client, trial_id: int, request: GrepRequest, attempt: int, rank: int,
           page: api.LogSearchResult | None) -> Iterator[api.LogSearchResult]:
    """Every page of one rank's search, from its first (`page`, when already read)."""
    start = None
    while True:
        if page is None:
            page = client.search_logs(trial_id, request.pattern, regex=request.regex,
                                      ignore_case=request.ignore_case, attempt=attempt,
                                      rank=rank, start=start, limit=PAGE_MATCHES)
        yield page
        if page["complete"]:
            return
        start, page = page["next_from"], None


def _lines(pages: Iterator[api.LogSearchResult]) -> Iterator[api.LogMatch]:
    """The first match of each line (a line with several matches is printed once)."""
    last_line = -1
    for page in pages:
        for match in page["matches"]:
            if match["line_offset"] != last_line:
                yield match
            last_line = match["line_offset"]


def _line(match: api.LogMatch, where: str, byte_offset: bool) -> str:
    """The matching line as grep prints it: `where` and the offset first, when asked."""
    offset = f"{match['line_offset']}:" if byte_offset else ""
    prefix = f"{where}{offset}"
    return f"{prefix}{match['before']}{match['text']}{match['after']}\n"
