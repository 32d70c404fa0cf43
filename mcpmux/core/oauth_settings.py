"""`[servers.NAME.oauth]`: how mcpmux signs in to an OAuth-protected HTTP upstream (docs/guide/security.md).

All keys are optional: with none, mcpmux discovers the authorization server from the upstream's
401 and registers itself there dynamically (RFC 7591).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

AuthMode = Literal["auto", "oauth", "none"]
"""`auto`: OAuth when the server answers 401 asking for it; `oauth`: always; `none`: never (static headers only)."""


class OAuthSettings(BaseModel):
    """A pre-registered client, the scopes to ask for, and the login callback's port."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str | None = None
    """A client registered with the authorization server beforehand; without it mcpmux registers itself."""
    client_secret_env: str | None = None
    """NAME of an environment variable holding that client's secret, never the secret itself."""
    scopes: list[str] = Field(default_factory=list)
    """Scopes to ask for; empty: those the server's metadata names."""
    redirect_port: int | None = Field(default=None, ge=1, le=65535)
    """The loopback port `mcpmux login` listens on for the callback (a client registered with a fixed
    redirect URI needs it); default: a free port."""

    @field_validator("client_secret_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("must be the NAME of an environment variable (letters, digits, _), not a secret")
        return value

    @model_validator(mode="after")
    def _check_secret_has_client(self) -> OAuthSettings:
        if self.client_secret_env is not None and self.client_id is None:
            raise ValueError("'client_secret_env' needs 'client_id' (the client that secret belongs to)")
        return self
