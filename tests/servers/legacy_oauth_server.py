"""An OAuth-protected MCP server as the 2025-03-26 revision described one, for the tests:
`python legacy_oauth_server.py PORT ISSUER`.

No protected-resource metadata: its authorization server is its own origin, its metadata at
`/.well-known/oauth-authorization-server`, naming ISSUER (`{origin}` in it is replaced by the
server's origin) and endpoints under `/oauth/`. It registers clients dynamically, approves every
authorization at once (PKCE S256 checked) and issues bearer tokens for an hour. Tool: `echo`.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import sys
from typing import Any
from urllib.parse import urlencode

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

PORT = int(sys.argv[1])
URL = f"http://127.0.0.1:{PORT}"
ISSUER = sys.argv[2].replace("{origin}", URL)

codes: dict[str, str] = {}
tokens: set[str] = set()


async def metadata(request: Request) -> Response:
    return JSONResponse(
        {
            "issuer": ISSUER,
            "authorization_endpoint": f"{URL}/oauth/authorize",
            "token_endpoint": f"{URL}/oauth/token",
            "registration_endpoint": f"{URL}/oauth/register",
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
        }
    )


async def register(request: Request) -> Response:
    client = {**await request.json(), "client_id": secrets.token_urlsafe(8), "token_endpoint_auth_method": "none"}
    return JSONResponse(client, status_code=201)


async def authorize(request: Request) -> Response:
    query = request.query_params
    code = secrets.token_urlsafe(16)
    codes[code] = query["code_challenge"]
    return RedirectResponse(f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query['state']})}", 302)


async def token(request: Request) -> Response:
    form = await request.form()
    challenge = codes.pop(str(form.get("code")), None)
    digest = hashlib.sha256(str(form.get("code_verifier", "")).encode()).digest()
    if challenge is None or base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != challenge:
        return JSONResponse({"error": "invalid_grant"}, status_code=400)
    issued = secrets.token_urlsafe(16)
    tokens.add(issued)
    return JSONResponse({"access_token": issued, "token_type": "Bearer", "expires_in": 3600})


auth_app = Starlette(
    routes=[
        Route("/.well-known/oauth-authorization-server", metadata),
        Route("/oauth/register", register, methods=["POST"]),
        Route("/oauth/authorize", authorize),
        Route("/oauth/token", token, methods=["POST"]),
    ]
)
server = MCPServer("legacy-oauth-demo")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


mcp_app = server.streamable_http_app()


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await mcp_app(scope, receive, send)
    elif scope["path"].startswith("/mcp"):
        if Request(scope, receive).headers.get("authorization", "").removeprefix("Bearer ") in tokens:
            await mcp_app(scope, receive, send)
        else:
            await JSONResponse({"error": "invalid_token"}, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
    else:
        await auth_app(scope, receive, send)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
