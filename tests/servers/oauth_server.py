"""An OAuth-protected MCP server (mcp SDK, `mcp.server.auth`) for the tests:
`python oauth_server.py PORT TTL [REFRESH_DELAY]`.

Its own authorization server registers clients dynamically and approves every authorization at
once (a redirect to the client's redirect_uri with the code, as a person clicking "allow" would
cause). Access tokens last TTL seconds and are bound to this server's URL (RFC 8707); refresh
tokens rotate: the one used is spent, REFRESH_DELAY seconds (default 0) after the refresh request
arrived, so that two clients refreshing at once both reach the exchange. Tools: `echo`,
`refreshes` (how many refreshes the authorization server has granted), `bearer` (the access token
the request came with). `POST /testing/revoke`
revokes every token it issued.

With `CIMD_CLIENT` (a URL) and `CIMD_REDIRECT` in the environment, its metadata advertises client ID
metadata documents and it knows that URL as a client whose document lists that redirect URI (what
a real authorization server would fetch from the URL; this one cannot reach https).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from typing import Any

import anyio
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse

PORT = int(sys.argv[1])
TTL = int(sys.argv[2])
REFRESH_DELAY = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
URL = f"http://127.0.0.1:{PORT}"
CIMD_CLIENT = os.environ.get("CIMD_CLIENT")
CIMD_REDIRECT = os.environ.get("CIMD_REDIRECT")


class Provider:
    """In-memory clients, codes and tokens."""

    def __init__(self) -> None:
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.refreshes = 0

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        if client_id == CIMD_CLIENT and CIMD_REDIRECT is not None:  # as its metadata document describes it
            return OAuthClientInformationFull(
                client_id=client_id,
                redirect_uris=[CIMD_REDIRECT],  # type: ignore[list-item]
                token_endpoint_auth_method="none",
                grant_types=["authorization_code", "refresh_token"],
            )
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = AuthorizationCode(
            code=secrets.token_urlsafe(16),
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        self.codes[code.code] = code
        return construct_redirect_uri(str(params.redirect_uri), code=code.code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        return self.codes.get(code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        del self.codes[authorization_code.code]
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        await anyio.sleep(REFRESH_DELAY)
        if self.refresh.pop(refresh_token.token, None) is None:
            raise TokenError("invalid_grant", "refresh token already used")
        self.refreshes += 1
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        access = self.access.get(token)
        if access is None or (access.expires_at is not None and access.expires_at < time.time()):
            return None
        return access

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        expires = int(time.time()) + TTL
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(access_token=access, expires_in=TTL, refresh_token=refresh, scope=" ".join(scopes) or None)


provider = Provider()
server = MCPServer(
    "oauth-demo",
    auth_server_provider=provider,
    auth=AuthSettings(
        issuer_url=URL,
        resource_server_url=f"{URL}/mcp",
        validate_token_resource=True,
        client_registration_options=ClientRegistrationOptions(enabled=True),
    ),
)


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def bearer(ctx: Context) -> str:
    """The access token this request came with: what its client sent this server."""
    return (ctx.headers or {}).get("authorization", "").removeprefix("Bearer ")


@server.tool()
def refreshes() -> int:
    """How many token refreshes the authorization server has granted."""
    return provider.refreshes


@server.custom_route("/testing/revoke", methods=["POST"])
async def revoke_all(request: Request) -> JSONResponse:
    revoked = len(provider.access) + len(provider.refresh)
    provider.access.clear()
    provider.refresh.clear()
    return JSONResponse({"revoked": revoked})


class AdvertiseMetadataDocuments:
    """ASGI middleware: the authorization server's metadata says it takes client ID metadata documents."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/.well-known/oauth-authorization-server":
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []
        start: dict[str, Any] = {}

        async def collect(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                parts.append(message.get("body", b""))

        await self.app(scope, receive, collect)
        body = json.dumps({**json.loads(b"".join(parts)), "client_id_metadata_document_supported": True}).encode()
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    if CIMD_CLIENT is None:
        server.run("streamable-http", host="127.0.0.1", port=PORT)
    else:
        import uvicorn

        uvicorn.run(AdvertiseMetadataDocuments(server.streamable_http_app()), host="127.0.0.1", port=PORT)
