"""Leg 1 of enterprise-managed authorization (SEP-990, the cross-app access extension): the user's
ID token from the enterprise identity provider exchanged there (RFC 8693 token exchange) for an
Identity Assertion Authorization Grant (ID-JAG) naming the MCP server's authorization server and
resource. Leg 2, the ID-JAG for an access token (RFC 7523 jwt-bearer), is the SDK's
`IdentityAssertionOAuthProvider`, which calls `id_jag_fetcher`'s function for each grant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx2

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"


class IdJagError(RuntimeError):
    """The identity provider refused the exchange; the message says what it answered."""


def id_jag_fetcher(token_endpoint: str, id_token: str, client_id: str | None) -> Callable[[str, str], Awaitable[str]]:
    """An async `(audience, resource) -> ID-JAG` that asks the identity provider at `token_endpoint`."""

    async def fetch(audience: str, resource: str) -> str:
        form = {
            "grant_type": TOKEN_EXCHANGE,
            "requested_token_type": ID_JAG,
            "audience": audience,
            "resource": resource,
            "subject_token": id_token,
            "subject_token_type": ID_TOKEN,
        }
        if client_id:
            form["client_id"] = client_id
        async with httpx2.AsyncClient(timeout=30.0) as http:
            response = await http.post(token_endpoint, data=form, headers={"Accept": "application/json"})
        answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        grant = answer.get("access_token") if isinstance(answer, dict) else None
        if response.status_code != 200 or not isinstance(grant, str):
            raise IdJagError(
                f"the identity provider at {token_endpoint} refused the token exchange "
                f"(HTTP {response.status_code}: {str(answer or response.text)[:200]})"
            )
        return grant

    return fetch
