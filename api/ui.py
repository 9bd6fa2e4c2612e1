"""The status UI and the API's docs page, as static files: ``/ui/``, ``/docs``, ``/static/``.

Nothing here is API. The files are the same for everyone and hold no data: every figure the UI
shows it asks the ``/v1`` API for, with the bearer token the person signed in with, so these
routes take no token and are left out of ``/openapi.json``. They are served from the package
(``api/static/``), with no build step and nothing fetched from elsewhere at run time: the two
libraries used are vendored under ``api/static/vendor/`` (the README's dependency table).

Every file goes out with a Content-Security-Policy that allows scripts, styles and requests of
this origin only (no inline script or style, no ``eval``, no frames, no plugins, no form posts
elsewhere), so a value that slipped past the UI's escaping still could not run. The docs page
needs inline styles for Swagger UI's layout, and only it gets them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core import events_schema

STATIC = Path(__file__).with_name("static")

_BASE_POLICY = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
UI_POLICY = f"{_BASE_POLICY}; style-src 'self'"
DOCS_POLICY = f"{_BASE_POLICY}; style-src 'self' 'unsafe-inline'"


def security_headers(policy: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cross-Origin-Opener-Policy": "same-origin",
        "Cross-Origin-Resource-Policy": "same-origin",
        # The files change with the code: a browser asks again (ETag makes that cheap).
        "Cache-Control": "no-cache",
    }


class _WithHeaders:
    """Wraps an ASGI app, adding ``headers`` to every response it starts."""

    def __init__(self, app: ASGIApp, headers: dict[str, str]) -> None:
        self._app = app
        self._headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self._headers.items():
                    headers[name] = value
            await send(message)

        await self._app(scope, receive, send_with_headers)


def _page(path: Path, policy: str) -> Callable[[Request], Awaitable[Response]]:
    async def page(request: Request) -> Response:
        return FileResponse(path, headers=security_headers(policy))

    return page


async def _to_ui(request: Request) -> Response:
    return RedirectResponse("/ui/", status_code=307)


async def _events_schema(request: Request) -> Response:
    return Response(
        events_schema.encoded(),
        media_type="application/schema+json",
        headers=security_headers(UI_POLICY),
    )


def routes() -> list[BaseRoute]:
    """The static routes (none of them API, none in ``/openapi.json``)."""
    ui = STATIC / "ui"
    return [
        Route("/", _to_ui, methods=["GET"]),
        Route("/ui", _to_ui, methods=["GET"]),
        Route("/ui/", _page(ui / "index.html", UI_POLICY), methods=["GET"]),
        Route("/docs", _page(STATIC / "docs" / "index.html", DOCS_POLICY), methods=["GET"]),
        Route("/docs/events.schema.json", _events_schema, methods=["GET"]),
        Mount(
            "/ui",
            app=_WithHeaders(StaticFiles(directory=ui), security_headers(UI_POLICY)),
        ),
        Mount(
            "/static",
            app=_WithHeaders(StaticFiles(directory=STATIC / "vendor"), security_headers(UI_POLICY)),
        ),
        Mount(
            "/docs",
            app=_WithHeaders(StaticFiles(directory=STATIC / "docs"), security_headers(DOCS_POLICY)),
        ),
    ]
