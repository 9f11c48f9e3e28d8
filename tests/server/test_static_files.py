"""The web UI's static files against a real server: pages name them with their digest, and
such an address may be kept for good; any other is asked again each time (its ETag)."""

from __future__ import annotations

import hashlib
import re

import httpx
import pytest

from muster import ui
from muster.server.static_files import IMMUTABLE
from tests.servers import RunningServer

pytestmark = pytest.mark.lifecycle  # a real server process


def test_a_page_s_files_are_kept_while_they_are_the_same(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {server.token}"}) as http:
        page = http.get("/").text
        named = dict(re.findall(r'(?:src|href)="/static/([^"?]+)\?v=([0-9a-f]+)"', page))
        assert {"muster.css", "theme.js", "muster.js", "vendor/htmx.min.js"} <= set(named)
        assert '="/static/' not in re.sub(r'="/static/[^"?]+\?v=[0-9a-f]+"', "", page)
        for name, digest in named.items():
            assert digest == hashlib.sha256((ui.STATIC / name).read_bytes()).hexdigest()[
                :len(digest)], name
        kept = http.get(f"/static/muster.css?v={named['muster.css']}")
        assert kept.status_code == 200
        assert kept.headers["cache-control"] == IMMUTABLE
        assert kept.headers["x-content-type-options"] == "nosniff"  # still the security set
        plain = http.get("/static/muster.css")
        stale = http.get("/static/muster.css?v=000000000000")  # a page from before a change
        assert plain.headers["cache-control"] == stale.headers["cache-control"] == "no-cache"
        again = http.get("/static/muster.css", headers={"If-None-Match": plain.headers["etag"]})
        assert again.status_code == 304
        assert http.get("/static/nothing.js?v=1").status_code == 404
