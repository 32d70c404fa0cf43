"""The SDK's OAuth providers (a login's, the machine grants'), with DPoP where the authorization server
advertises it (`dpop`): the SDK has no DPoP client, and its `OAuthToken` holds Bearer tokens only.

    discovery ▶ the authorization server's metadata lists ES256 in dpop_signing_alg_values_supported?
        yes ▶ token requests signed with this provider's key; a "DPoP" token sent as `Authorization: DPoP`,
              each request signed too
        no  ▶ no proof anywhere: a bearer token, as from the SDK's own provider
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.exceptions import OAuthTokenError
from pydantic import ValidationError

from mcpmux.upstream.oauth.dpop import DpopKey, noting_dpop_support, parse_token, signed


class DpopProvider(OAuthClientProvider):
    """Put first among the bases of an SDK provider class: that provider, with DPoP where advertised."""

    dpop_advertised: bool = False
    """Whether the authorization server's metadata lists ES256 for DPoP (read at discovery)."""
    bound: bool = False
    """Whether the token is DPoP-bound (`token_type` "DPoP")."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dpop = DpopKey.generate()

    def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        flow = noting_dpop_support(self._unsigned_flow(request), self._note_dpop)
        return signed(flow, lambda: self.dpop if self.dpop_advertised else None)

    def _unsigned_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        """The flow that gets signed: the SDK provider's (a subclass may wrap it)."""
        return super()._auth_flow(request)

    def _note_dpop(self, advertised: bool) -> None:
        self.dpop_advertised = advertised

    async def _handle_token_response(self, response: httpx2.Response) -> None:
        if response.status_code not in {200, 201}:
            await super()._handle_token_response(response)  # raises, with the server's answer
        try:
            token, self.bound = parse_token(await response.aread())
        except (ValidationError, ValueError) as err:
            raise OAuthTokenError(f"Invalid token response: {err}") from None
        if token.scope is None:  # RFC 6749 §5.1: what was asked for was granted (as the SDK records it)
            token.scope = self.context.client_metadata.scope
        self.context.current_tokens = token
        self.context.update_token_expiry(token)
        await self.context.storage.set_tokens(token)

    def _add_auth_header(self, request: httpx2.Request) -> None:
        tokens = self.context.current_tokens
        if tokens is not None and tokens.access_token:
            request.headers["Authorization"] = f"{'DPoP' if self.bound else 'Bearer'} {tokens.access_token}"
