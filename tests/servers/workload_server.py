"""An MCP server whose authorization server takes the RFC 7523 jwt-bearer grant only (workload
identity federation), for the tests: `python workload_server.py PORT TTL`, with the PEM of the
workload platform's public key in `$WORKLOAD_PUBLIC_KEY`.

The token endpoint takes an ES256 JWT signed by that key, for this server's URL as audience, from
the public client `workload` (no secret), and issues a bearer token for TTL seconds; anything else
is refused with the RFC 6749 error a real one would give. Tools: `echo`; `grants`, the subjects of
the assertions granted and the errors given, in order (JSON).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from typing import Any

import jwt
import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

PORT = int(sys.argv[1])
TTL = int(sys.argv[2])
URL = f"http://127.0.0.1:{PORT}"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
PUBLIC_KEY = os.environ["WORKLOAD_PUBLIC_KEY"]

history: list[str] = []
tokens: dict[str, float] = {}


async def protected_resource(request: Request) -> Response:
    return JSONResponse({"resource": f"{URL}/mcp", "authorization_servers": [URL]})


async def authorization_server(request: Request) -> Response:
    return JSONResponse(
        {
            "issuer": URL,
            "authorization_endpoint": f"{URL}/authorize",
            "token_endpoint": f"{URL}/token",
            "response_types_supported": ["code"],
            "grant_types_supported": [JWT_BEARER],
            "token_endpoint_auth_methods_supported": ["none"],
        }
    )


def _refuse(error: str) -> Response:
    history.append(error)
    return JSONResponse({"error": error}, status_code=400)


async def token(request: Request) -> Response:
    form = await request.form()
    if form.get("grant_type") != JWT_BEARER:
        return _refuse("unsupported_grant_type")
    if form.get("client_id") != "workload" or "client_secret" in form or "authorization" in request.headers:
        return _refuse("invalid_client")
    try:
        claims = jwt.decode(str(form.get("assertion", "")), PUBLIC_KEY, algorithms=["ES256"], audience=URL)
    except jwt.PyJWTError:
        return _refuse("invalid_grant")
    history.append(str(claims.get("sub")))
    issued = secrets.token_urlsafe(16)
    tokens[issued] = time.time() + TTL
    return JSONResponse({"access_token": issued, "token_type": "Bearer", "expires_in": TTL})


auth_app = Starlette(
    routes=[
        Route("/.well-known/oauth-protected-resource/mcp", protected_resource),
        Route("/.well-known/oauth-authorization-server", authorization_server),
        Route("/token", token, methods=["POST"]),
    ]
)
server = MCPServer("workload-demo")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def grants() -> str:
    """The subjects granted and the errors given, in order."""
    return json.dumps(history)


mcp_app = server.streamable_http_app()


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await mcp_app(scope, receive, send)
    elif scope["path"].startswith("/mcp"):
        presented = Request(scope, receive).headers.get("authorization", "").removeprefix("Bearer ")
        if tokens.get(presented, 0) > time.time():
            await mcp_app(scope, receive, send)
            return
        challenge = f'Bearer resource_metadata="{URL}/.well-known/oauth-protected-resource/mcp"'
        await JSONResponse({"error": "invalid_token"}, 401, {"WWW-Authenticate": challenge})(scope, receive, send)
    else:
        await auth_app(scope, receive, send)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
