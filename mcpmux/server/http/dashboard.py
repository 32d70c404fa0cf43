"""The dashboard: a page at `/` of the HTTP front that a person keeps open, and the state it polls.

`GET /` is the page (`dashboard_page`): static, no data in it, so the edge serves it without a
token (`HttpEdge`), and a browser can load it before it knows one. `GET /dashboard/state` is the
data (`dashboard_state.snapshot`), behind the same checks as `/mcp`: loopback only unless tokens
are set, then one of them. It shows every upstream, so a token bound to a profile (which sees only
that profile's part of the catalog over MCP) is refused it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mcp.server.connection import Connection
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from mcpmux.mux.multiplexer import Mux
from mcpmux.server.http.dashboard_page import CONTENT_SECURITY_POLICY, PAGE
from mcpmux.server.http.dashboard_state import snapshot
from mcpmux.server.http.edge import DASHBOARD_PATH, PROFILE_SCOPE

STATE_PATH = "/dashboard/state"
_NO_STORE = {"Cache-Control": "no-store"}


def dashboard_routes(mux: Mux, connections: Callable[[], Iterable[Connection]]) -> list[Route]:
    """The page and its state, for the HTTP front's app; `connections`: the front's client connections."""

    async def page(request: Request) -> Response:
        headers = {**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"}
        return Response(PAGE, media_type="text/html; charset=utf-8", headers=headers)

    async def state(request: Request) -> Response:
        bound = request.scope.get(PROFILE_SCOPE)
        if bound is not None:
            return PlainTextResponse(
                f"this bearer token is bound to profile {bound!r}, and the dashboard shows every upstream: "
                "use one of [http]'s own tokens",
                status_code=403,
            )
        return JSONResponse(snapshot(mux, connections), headers=_NO_STORE)

    return [Route(DASHBOARD_PATH, page, methods=["GET"]), Route(STATE_PATH, state, methods=["GET"])]
