"""The status page: a static shell at `/` whose script polls the control API's JSON routes.

The shell and its files are the same for every daemon and carry no data, so they are
served without the bearer token (the `Host` check still applies); every number on the
page comes from the JSON routes, which the script calls with the token the user enters
once (kept in the tab's `sessionStorage`). The headers forbid framing the page (so
another site cannot trick a click on its buttons) and loading anything from elsewhere.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from aiohttp import web

from anyrtd.control.guard import public
from anyrtd.model import STANDING_BUILTINS
from anyrtd.vocab import (
    STAMP_PREFIX,
    LastStatus,
    Marker,
    RunStatus,
    Severity,
    StateReason,
    TriggerState,
    Verdict,
)

STATIC = resources.files("anyrtd.control").joinpath("static")
SHELL = "index.html"
ASSETS = {
    "app.js": "text/javascript",
    "agenda.js": "text/javascript",
    "app.css": "text/css",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@functools.cache
def _read(name: str) -> bytes:
    """Return a file of the page, read once: the installed files do not change."""
    return STATIC.joinpath(name).read_bytes()


def vocabulary() -> dict[str, Any]:
    """Return anyrtd's words as the page's script reads them: each enum by member name."""
    enums = (RunStatus, Marker, LastStatus, Verdict, TriggerState, StateReason, Severity)
    words: dict[str, Any] = {e.__name__: {m.name: m.value for m in e} for e in enums}
    words["stampPrefix"] = STAMP_PREFIX
    words["standingBuiltins"] = sorted(STANDING_BUILTINS)
    return words


VOCAB_JSON = json.dumps(vocabulary(), separators=(",", ":")).encode()


def _file_response(name: str, content_type: str) -> web.Response:
    return web.Response(
        body=_read(name), content_type=content_type, charset="utf-8", headers=HEADERS
    )


@public
async def status_page(request: web.Request) -> web.Response:
    """GET /: the status page's shell."""
    return _file_response(SHELL, "text/html")


@public
async def status_asset(request: web.Request) -> web.Response:
    """GET /static/:name: the status page's script, stylesheet and words (`vocab.json`)."""
    name = request.match_info["name"]
    if name == "vocab.json":
        return web.Response(body=VOCAB_JSON, content_type="application/json", headers=HEADERS)
    content_type = ASSETS.get(name)
    if content_type is None:
        raise web.HTTPNotFound(text=f"no file {name!r} here: the status page is at /")
    return _file_response(name, content_type)


def add_routes(app: web.Application) -> None:
    """Register the status page's routes on the control API application."""
    app.router.add_get("/", status_page)
    app.router.add_get("/static/{name}", status_asset)


OPENAPI_PATHS: dict[str, Any] = {
    "/": {
        "get": {
            "summary": "The status page (HTML; needs no token: it holds no data, its script "
            "reads the JSON routes).",
            "responses": {
                "200": {
                    "description": "The page's shell.",
                    "content": {"text/html": {"schema": {"type": "string"}}},
                }
            },
        }
    },
    "/static/{name}": {
        "get": {
            "summary": "The status page's script, stylesheet and vocabulary.",
            "parameters": [
                {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {
                    "description": "app.js, agenda.js, app.css, or vocab.json (anyrtd's words: run "
                    "statuses, markers, states, verdicts).",
                    "content": {
                        "text/javascript": {"schema": {"type": "string"}},
                        "text/css": {"schema": {"type": "string"}},
                        "application/json": {"schema": {"type": "object"}},
                    },
                },
                "404": {
                    "description": "No such file.",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            },
        }
    },
}
"""The status page's routes as the OpenAPI document lists them."""
