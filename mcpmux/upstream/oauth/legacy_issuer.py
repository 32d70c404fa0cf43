"""The issuer of a 2025-03-26 server's own authorization server, for the SDK's issuer check.

A server of the 2025-03-26 revision publishes no protected-resource metadata (RFC 9728 came with
2025-06-18): its authorization server is its own origin, with metadata at
`<origin>/.well-known/oauth-authorization-server`, and that revision asked nothing more of the
document. Such a server may name an issuer on its origin with a path (`<origin>/oauth`), which the
SDK's strict check (RFC 8414 §3.3, SEP-2468: the issuer must be the URL the document was built
from, here the bare origin) refuses. `noting_legacy_issuer` looks at that document as soon as the
SDK's discovery has found no protected-resource metadata, and hands the login the issuer it names
when that issuer is on the MCP server's own origin, scheme, host and port alike: the authorization
server mcpmux was told to use is then still the one that origin runs, so nothing is taken from
anywhere else. Any other issuer is left to the SDK, which refuses it; a server that publishes
protected-resource metadata (every current one) is checked exactly as the SDK checks it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from urllib.parse import urlsplit

import httpx2
from mcp.client.auth.utils import create_oauth_metadata_request
from mcp.shared.auth import OAuthMetadata
from pydantic import ValidationError

ROOT_RESOURCE_METADATA = "/.well-known/oauth-protected-resource"
"""The last place the SDK looks for protected-resource metadata (RFC 9728 §3): none there, none at all."""


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


async def noting_legacy_issuer(
    flow: AsyncGenerator[httpx2.Request, httpx2.Response], server_url: str, note: Callable[[str], None]
) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
    """`flow` (the SDK's login flow), with `note(issuer)` called before it settles on the issuer to
    expect, where the server publishes no protected-resource metadata and its origin's
    authorization server metadata names an issuer on that origin."""
    origin = _origin(server_url)
    try:
        request = await flow.__anext__()
        while True:
            response = yield request
            missing = request.url.path == ROOT_RESOURCE_METADATA and 400 <= response.status_code < 500
            if missing and _origin(str(request.url)) == origin:
                answer = yield create_oauth_metadata_request(f"{origin}/.well-known/oauth-authorization-server")
                issuer = await _issuer(answer)
                if issuer is not None and _origin(issuer) == origin:
                    note(issuer)
            request = await flow.asend(response)
    except StopAsyncIteration:
        return
    finally:
        await flow.aclose()


async def _issuer(response: httpx2.Response) -> str | None:
    if response.status_code != 200:
        return None
    try:
        return str(OAuthMetadata.model_validate_json(await response.aread()).issuer)
    except ValidationError:
        return None
