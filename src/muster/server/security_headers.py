"""The headers that keep a user's string from ever running as code in another user's page.

Every response carries them, whatever answered it (a page, the API, a static file, an
error, a 404): a strict Content-Security-Policy (scripts and styles only from the server's
own files, no inline script or style, no eval, no plugins, no framing, no `<base>`), and
the headers that stop framing, content sniffing and leaking paths in the Referer.

The web UI keeps to the policy: no inline `<script>`, `style="..."` or `on...=` in the
templates, browser code that builds text with `textContent`, and htmx configured (base.html)
without eval and without its injected `<style>`; `tests/ui/test_no_script_from_data.py`
holds it to that.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_SECURITY_POLICY", "HEADERS", "SecurityHeaders"]

CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; object-src 'none'; "
                           "frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_RAW = [(name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in HEADERS.items()]
_NAMES = frozenset(name for name, _ in _RAW)


class SecurityHeaders:
    """ASGI middleware: `HEADERS` on every HTTP response, in place of any a route set."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(name, value) for name, value in message.get("headers", ())
                        if name.lower() not in _NAMES]
                message["headers"] = kept + _RAW
            await send(message)

        await self.app(scope, receive, with_headers)
