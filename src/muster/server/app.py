"""The FastAPI application: the platform (`platform.py`), routes and error handling.

The API's reference is `/openapi.json` (no token needed), and there is no `/docs` or
`/redoc` page. FastAPI's pages load Swagger UI and ReDoc from a CDN, so on the offline
machines muster runs on they are blank; serving the assets ourselves would mean shipping a
copy of a JavaScript bundle (the PyPI packages that carry one, e.g. `swagger-ui-bundle`, lag
Swagger UI by years) and keeping it patched, for a page the CLI and the SDK make
unnecessary. Any OpenAPI viewer a user has reads `/openapi.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
from collections.abc import AsyncIterator
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from muster import __version__, ui
from muster.errors import ConfigError, MusterError, StorageError, TooManyRequests
from muster.home import Home
from muster.launch.identity import own_identity
from muster.launch.local import LocalLauncher
from muster.server import account_routes, drill_routes, quota_routes
from muster.server.account_pages import account_pages
from muster.server.body_limit import BodyLimit
from muster.server.compare_pages import compare_pages
from muster.server.drill_pages import drill_pages
from muster.server.model_pages import model_pages
from muster.server.orchestrator import TICK_SECONDS, Orchestrator
from muster.server.pages import error_page, pages
from muster.server.platform import open_platform
from muster.server.routes import PREFIX, public, router, scrape
from muster.server.security_headers import HEADERS, SecurityHeaders
from muster.server.settings import ServerSettings
from muster.server.state import ServerState
from muster.server.static_files import Assets
from muster.server.usage_pages import usage_pages
from muster.server.wakeups import SAFETY_NET_SECONDS
from muster.services.users import bootstrap

log = logging.getLogger(__name__)


def create_app(home: Home, settings: ServerSettings | None = None) -> FastAPI:
    """The muster server for `home`.

    Raises:
        ConfigError: the cluster config is invalid, or its `run_as` cannot be met here.
    """
    platform = open_platform(home, settings or ServerSettings())
    # MUSTER_WAKEUPS=0: poll every TICK_SECONDS instead (a file system whose changes inotify
    # does not see, such as another machine's writes to NFS; a comparison).
    wakeups = os.environ.get("MUSTER_WAKEUPS", "1") != "0"
    state = ServerState(platform, Orchestrator(
        platform.supervisor, safety_net=_safety_net(),
        use_wakeups=wakeups and platform.launcher.capabilities.watchable_files))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store, home = platform.store, platform.home
        await asyncio.to_thread(store.upgrade)
        admin = await asyncio.to_thread(bootstrap, store, home.token_path)
        log.info("the token in %s is %s's (an admin)", home.token_path, admin)
        if platform.drills is not None:  # its new experiments wake the passes at once
            loop = asyncio.get_running_loop()

            def wake_passes() -> None:
                loop.call_soon_threadsafe(state.orchestrator.wake.set)

            platform.drills.wake_passes = wake_passes
        platform.start()
        if isinstance(platform.launcher, LocalLauncher):
            await asyncio.to_thread(platform.launcher.warm_up)
            _wake_on_replica_exit(state.orchestrator, platform.launcher)
        task = asyncio.create_task(state.orchestrator.run(), name="muster-orchestrator")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            state.log_watch.close()
            await state.feed.close()
            await asyncio.to_thread(platform.close)

    app = FastAPI(title="muster", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # see the module's docstring
    app.state.muster = state
    cluster = platform.settings
    app.add_middleware(BodyLimit, exempt=(("POST", f"{PREFIX}/experiments"),
                                          ("POST", f"{PREFIX}/drills")))
    if cluster.trusted_proxies:
        # The client's address (login limits) and scheme (Secure cookies) come from
        # X-Forwarded-For and -Proto only when a trusted proxy sends them.
        app.add_middleware(ProxyHeadersMiddleware,
                           trusted_hosts=trusted_proxies(cluster.trusted_proxies))
    app.add_middleware(SecurityHeaders)  # outermost: BodyLimit's 413 carries them too
    app.include_router(public)
    app.include_router(router)
    app.include_router(account_routes.public)
    app.include_router(account_routes.router)
    app.include_router(quota_routes.router)
    app.include_router(drill_routes.router)
    app.include_router(scrape)
    app.include_router(pages)
    app.include_router(account_pages)
    app.include_router(compare_pages)
    app.include_router(model_pages)
    app.include_router(usage_pages)
    app.include_router(drill_pages)
    app.mount("/static", Assets(directory=ui.STATIC), name="static")
    _install_error_handlers(app)
    return app


def trusted_proxies(entries: list[str]) -> list[str]:
    """The cluster config's `trusted_proxies`, each an address or a network.

    Raises:
        ConfigError: one is neither.
    """
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(
                f"trusted_proxies: {entry!r} is no IP address or network; write e.g. "
                "127.0.0.1 or 10.0.0.0/8 (cluster config)") from None
    return entries


def _safety_net() -> float:
    """Seconds between passes that nothing woke, where wake-ups report what changes:
    `MUSTER_SAFETY_NET_SECONDS`, by default `wakeups.SAFETY_NET_SECONDS`."""
    text = os.environ.get("MUSTER_SAFETY_NET_SECONDS")
    if text is None:
        return SAFETY_NET_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.05 <= seconds <= 3600:
        raise ConfigError(f"MUSTER_SAFETY_NET_SECONDS must be seconds between 0.05 and 3600, "
                          f"got {text!r}; unset it for the default {SAFETY_NET_SECONDS:g}")
    return seconds


def _wake_on_replica_exit(orchestrator: Orchestrator, launcher: LocalLauncher) -> None:
    """Run the next pass as soon as a shim reports a started or an ended replica
    (SIGUSR1), instead of up to TICK_SECONDS later. Only where this event loop can take the
    signal (the main thread); elsewhere starts and ends are found by the regular passes."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, orchestrator.wake.set)
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        log.info("replica starts and ends are noticed on the next pass (every %ss): %s",
                 TICK_SECONDS, exc)
        return
    launcher.notify = own_identity()


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MusterError)
    async def muster_error(request: Request, exc: MusterError) -> Response:
        if isinstance(exc, StorageError) and exc.detail:  # the remote's words: for admins
            log.warning("%s %s: %s", request.method, request.url.path, exc.for_log())
        if _is_page(request):
            return error_page(request, exc.http_status, str(exc))
        response = _error(exc.http_status, type(exc).__name__, str(exc))
        if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        if _is_page(request):
            return error_page(request, 404 if "path" in problems else 422, problems)
        return _error(422, "InvalidRequest", problems)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        # Starlette's and FastAPI's own errors (no such route, wrong method, a body that is
        # not JSON) in the same shape as ours.
        kind = ("PayloadTooLarge" if exc.status_code == 413
                else HTTPStatus(exc.status_code).phrase.replace(" ", ""))
        hint = ("/openapi.json lists the routes" if exc.status_code in (404, 405)
                else "/openapi.json says what it takes (a JSON body is UTF-8 JSON)")
        message = f"{exc.detail}: {request.method} {request.url.path}; {hint}"
        if _is_page(request) and exc.status_code in (404, 405):
            return error_page(request, exc.status_code, f"There is no page {request.url.path}.")
        response = _error(exc.status_code, kind, message)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        # Starlette answers this one outside every middleware, SecurityHeaders too.
        response = _error(500, "InternalError", "internal server error; the server log has "
                          "details")
        response.headers.update(HEADERS)
        return response


def _is_page(request: Request) -> bool:
    """A request of the web UI's (an HTML page), not of the API or Prometheus."""
    path = request.url.path
    return not (path.startswith(("/api/", "/static/")) or path in ("/metrics",
                                                                     "/openapi.json"))


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": kind, "message": message})
