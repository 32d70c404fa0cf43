"""Workload identity federation (SEP-1933): a workload with no person and no secret gets its tokens
by presenting the JWT its platform issued it (a Kubernetes service account token, a cloud
instance's identity token) to the MCP server's authorization server, with the RFC 7523 jwt-bearer
grant, as the public client `client_id`.

    401 ▶ protected-resource metadata ▶ authorization server metadata (the SDK's discovery)
        ▶ POST token endpoint: grant_type jwt-bearer, assertion = the workload's JWT, client_id

The SDK's jwt-bearer provider (`IdentityAssertionOAuthProvider`) authenticates a confidential
client; this one sends no client secret: the assertion is the credential. A refused grant
(invalid_grant, invalid_scope, unauthorized_client) is raised as it is, never retried with
another grant type.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
from mcp.client.auth import TokenStorage
from mcp.client.auth.exceptions import OAuthFlowError
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata

from mcpmux.upstream.oauth.dpop_provider import DpopProvider

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class WorkloadIdentityProvider(DpopProvider):
    """The SDK's provider (discovery, token handling), with the jwt-bearer grant as its authorization,
    and DPoP where the authorization server advertises it."""

    def __init__(
        self, server_url: str, storage: TokenStorage, client_id: str, assertion: Callable[[], str], scope: str | None
    ) -> None:
        metadata = OAuthClientMetadata(
            redirect_uris=None, grant_types=[JWT_BEARER], token_endpoint_auth_method="none", scope=scope
        )
        super().__init__(server_url, metadata, storage)
        self._assertion = assertion
        self._client = OAuthClientInformationFull(
            redirect_uris=None,
            client_id=client_id,
            grant_types=[JWT_BEARER],
            token_endpoint_auth_method="none",
            scope=scope,
        )

    async def _initialize(self) -> None:
        self.context.current_tokens = await self.context.storage.get_tokens()
        self.context.client_info = self._client  # configured: nothing to register
        self._initialized = True

    async def _perform_authorization(self) -> httpx2.Request:
        form: dict[str, Any] = {"grant_type": JWT_BEARER, "assertion": self._assertion()}
        form["client_id"] = self._client.client_id  # a public client names itself (RFC 6749 §3.2.1)
        if self.context.should_include_resource_param(self.context.protocol_version):
            form["resource"] = self.context.get_resource_url()  # RFC 8707
        if self.context.client_metadata.scope:
            form["scope"] = self.context.client_metadata.scope
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        return httpx2.Request("POST", self._get_token_endpoint(), data=form, headers=headers)


def static_assertion(token: str) -> Callable[[], str]:
    """A JWT given once (an environment variable's): a workload restarted with a new one when it lapses."""
    return lambda: token


def file_assertion(path: str) -> Callable[[], str]:
    """The JWT in `path`, read anew each time (the platform replaces it before it expires)."""

    def read() -> str:
        try:
            token = Path(path).expanduser().read_text().strip()
        except OSError as err:
            raise OAuthFlowError(f"cannot read the workload's JWT from {path} ({err.strerror})") from None
        if not token:
            raise OAuthFlowError(f"the workload's JWT file {path} is empty")
        return token

    return read
