"""The web UI's model registry: `/models` and `/models/{name}`.

`/models` lists the models (`GET /api/v1/models`), `MODEL_ROWS` a page, each with its latest
version, and offers the users who may submit a "New model" form (`POST /api/v1/models`,
sent by the page with the session's CSRF token, as every action of the UI:
`static/muster.js`'s `data-act`).
`/models/{name}` (`GET /api/v1/models/{name}`) shows the newest 100 versions (and how many
more there are, with the command that lists them all), each with its stage, its
verification (verified, or the "unverified: reason, by whom" mark), who registered it and
when, its metrics at the checkpoint, links to its trial, its experiment and the snapshot
diff against the version before it, its download
(`GET /api/v1/models/{name}/versions/{v}/download`) and its whole lineage. Versions are
registered from a trial's page (`server/register_form.py`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, Response

from muster.server.pages import Visitor, render, server_state, to_login
from muster.services import registry
from muster.store import MAX_INTEGER

__all__ = ["model_pages"]

model_pages = APIRouter(include_in_schema=False)
MODEL_ROWS = 100  # models per page of the list

# As the API's `{name}`: a name that cannot be a model's is a 404 page.
ModelName = Annotated[str, Path(min_length=1, max_length=128,
                                pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


@model_pages.get("/models", response_class=HTMLResponse)
def models_page(request: Request, who: Visitor,
                offset: Annotated[int, Query(ge=0, le=MAX_INTEGER)] = 0) -> Response:
    """A page of the models, by name, each with its latest version; the New model form."""
    if who is None:
        return to_login(request)
    return render(request, "models.html", who, nav="models",
                  page=registry.list_models(server_state(request).store, offset, MODEL_ROWS))


@model_pages.get("/models/{name}", response_class=HTMLResponse)
def model_page(request: Request, who: Visitor, name: ModelName) -> Response:
    """A model's newest 100 versions, oldest first, each with its lineage."""
    if who is None:
        return to_login(request)
    return render(request, "model.html", who, nav="models",
                  model=registry.describe_model(server_state(request).store, name))
