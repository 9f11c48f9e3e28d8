"""The FastAPI application: wiring of store, supervisor, routes and error handling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from muster import __version__
from muster.errors import MusterError
from muster.home import Home
from muster.launch.local import LocalLauncher
from muster.server.auth import ensure_token
from muster.store import Store
from muster.supervise.reconcile import reconcile_attempts
from muster.supervise.supervisor import Supervisor

log = logging.getLogger(__name__)

TICK_SECONDS = 0.2
RETRY_SECONDS = 2.0


@dataclass
class Orchestrator:
    """Runs the supervisor's ticks on the server's event loop (one at a time, in a thread)."""

    supervisor: Supervisor
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        await self._reconcile()
        while True:
            # Cleared before the pass, not after: a wake-up that arrives during a pass (a
            # trial created after the pass looked at the queue) must start the next one now.
            self.wake.clear()
            try:
                await asyncio.to_thread(self.supervisor.tick)
            except MusterError as exc:
                log.error("supervisor pass failed: %s", exc)
            except Exception:
                log.exception("supervisor pass failed unexpectedly; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), TICK_SECONDS)


    async def _reconcile(self) -> None:
        """Settle every unfinished attempt before any new work starts; a failure (e.g. the
        database is down) is retried, never skipped, so no attempt is launched twice."""
        while True:
            try:
                await asyncio.to_thread(reconcile_attempts, self.supervisor)
                return
            except MusterError as exc:
                log.error("reconciliation failed, retrying in %ss: %s", RETRY_SECONDS, exc)
            except Exception:
                log.exception("reconciliation failed unexpectedly, retrying in %ss",
                              RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)


@dataclass(frozen=True)
class ServerSettings:
    """What `muster up` configures beyond the home: the store and the scheduling limits."""

    db_url: str | None = None  # default: SQLite in the home
    slots: int | None = None  # trials at once; default: CPU count
    min_free_disk: int = 5 * 1024**3  # the disk guard (docs/architecture.md)


@dataclass
class ServerState:
    home: Home
    store: Store
    token: str
    orchestrator: Orchestrator


def create_app(home: Home, settings: ServerSettings | None = None) -> FastAPI:
    """The muster server for `home`."""
    from muster.server.routes import public, router

    home.ensure()
    settings = settings or ServerSettings()
    store = Store(settings.db_url or home.default_db_url)
    supervisor = Supervisor(store=store, launcher=LocalLauncher(), home=home,
                            min_free_disk=settings.min_free_disk)
    if settings.slots is not None:
        supervisor.slots = settings.slots

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(store.upgrade)
        orchestrator = Orchestrator(supervisor)
        app.state.muster = ServerState(home, store, ensure_token(home.token_path), orchestrator)
        task = asyncio.create_task(orchestrator.run(), name="muster-orchestrator")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            store.dispose()

    app = FastAPI(title="muster", version=__version__, lifespan=lifespan)
    app.include_router(public)
    app.include_router(router)
    _install_error_handlers(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MusterError)
    async def muster_error(request: Request, exc: MusterError) -> JSONResponse:
        return _error(exc.http_status, type(exc).__name__, str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        return _error(422, "InvalidRequest", problems)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own errors (no such route, wrong method) in the same shape as ours.
        kind = HTTPStatus(exc.status_code).phrase.replace(" ", "")
        message = (f"{exc.detail}: {request.method} {request.url.path}; "
                   "/openapi.json lists the routes")
        response = _error(exc.status_code, kind, message)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return _error(500, "InternalError", "internal server error; the server log has details")


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": kind, "message": message})
