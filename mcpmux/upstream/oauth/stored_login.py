"""What `mcpmux login` stores for one upstream, and what `serve` reads back: the token, when it
expires, the client it was issued to, where to refresh it, and the DPoP key it is bound to."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import ValidationError

REFRESH_MARGIN = 60.0
"""Seconds before its expiry a token is refreshed, so that no request goes out with one about to lapse
(a tenth of its lifetime, for a token that lives less than ten minutes)."""


@dataclass(frozen=True, slots=True)
class StoredLogin:
    token: OAuthToken
    expires_at: float | None
    """Unix time the access token lapses; None when the server gave no lifetime."""
    client: OAuthClientInformationFull
    token_endpoint: str
    resource: str | None
    """The RFC 8707 resource the token was issued for, sent again with each refresh."""
    dpop_key: str | None = None
    """The PEM of the login's DPoP key pair (`dpop`) where the authorization server takes DPoP: every
    token request and, for a bound token, every request to the server carries a proof made with it."""
    bound: bool = False
    """Whether the access token is DPoP-bound (`token_type` "DPoP"): sent as `Authorization: DPoP`."""

    @classmethod
    def issued(
        cls,
        token: OAuthToken,
        client: OAuthClientInformationFull,
        token_endpoint: str,
        resource: str | None,
        *,
        dpop_key: str | None = None,
        bound: bool = False,
    ) -> StoredLogin:
        return cls(token, _expiry(token), client, token_endpoint, resource, dpop_key, bound)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> StoredLogin | None:
        """The login a record holds; None for one this version cannot read (a new login replaces it)."""
        try:
            return cls(
                token=OAuthToken.model_validate(record["token"]),
                expires_at=float(record["expires_at"]) if record.get("expires_at") is not None else None,
                client=OAuthClientInformationFull.model_validate(record["client"]),
                token_endpoint=str(record["token_endpoint"]),
                resource=record.get("resource"),
                dpop_key=str(record["dpop_key"]) if record.get("dpop_key") else None,
                bound=record.get("token_type") == "DPoP",
            )
        except (KeyError, TypeError, ValueError, ValidationError):
            return None

    def to_record(self, *, keep_secret: bool) -> dict[str, Any]:
        """The JSON to store; `keep_secret` False leaves out a client secret that comes from the environment."""
        client = self.client if keep_secret else self.client.model_copy(update={"client_secret": None})
        return {
            "token": self.token.model_dump(mode="json", exclude_none=True),
            "expires_at": self.expires_at,
            "client": client.model_dump(mode="json", exclude_none=True),
            "token_endpoint": self.token_endpoint,
            "resource": self.resource,
            "dpop_key": self.dpop_key,
            "token_type": "DPoP" if self.bound else "Bearer",
        }

    def due(self, now: float | None = None) -> bool:
        """Whether the access token lapses within `REFRESH_MARGIN` (or already has)."""
        if self.expires_at is None:
            return False
        margin = min(REFRESH_MARGIN, 0.1 * float(self.token.expires_in or 0))
        return (now or time.time()) >= self.expires_at - margin

    def refresh_due(self, now: float | None = None) -> bool:
        """Whether to refresh before the next request: when `due`, if a refresh token allows it; without
        one the token serves until it has lapsed (then only a new login helps)."""
        if self.token.refresh_token:
            return self.due(now)
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    @property
    def scheme(self) -> str:
        """The `Authorization` scheme the access token is sent with."""
        return "DPoP" if self.bound else "Bearer"

    def refreshed(self, token: OAuthToken, *, bound: bool = False) -> StoredLogin:
        """After a refresh: a server that did not rotate the refresh token keeps the old one (RFC 6749 §6)."""
        if token.refresh_token is None:
            token = token.model_copy(update={"refresh_token": self.token.refresh_token})
        if token.scope is None:
            token = token.model_copy(update={"scope": self.token.scope})
        return replace(self, token=token, expires_at=_expiry(token), bound=bound)


def _expiry(token: OAuthToken) -> float | None:
    return None if token.expires_in is None else time.time() + float(token.expires_in)
