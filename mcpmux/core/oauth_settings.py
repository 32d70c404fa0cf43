"""OAuth settings (docs/guide/security.md): `[servers.NAME.oauth]`, how mcpmux signs in to an
OAuth-protected HTTP upstream (every key optional: with none, mcpmux discovers the authorization
server from the upstream's 401 and registers itself there, RFC 7591), and `[http.oauth]`, the HTTP
front as a resource server.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

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
    client_metadata_url: str | None = None
    """An https URL where a client metadata document for mcpmux is published (OAuth client ID
    metadata documents): the client id with authorization servers that support them; with the
    others mcpmux registers itself."""
    grant: Literal["authorization_code", "client_credentials", "identity_assertion", "workload_identity"] = (
        "authorization_code"
    )
    """"authorization_code": a person logs in (`mcpmux login`). With no login: "client_credentials",
    mcpmux as the machine client `client_id`, with its secret (`client_secret_env`, sent with HTTP
    Basic) or a private key (`private_key_env`, private_key_jwt); "identity_assertion"
    (enterprise-managed authorization), the user's ID token (`id_token_env`) exchanged at the
    identity provider (`idp_token_endpoint`) for a grant that `client_id` presents to `issuer`;
    "workload_identity" (workload identity federation, RFC 7523 jwt-bearer), the JWT the workload's
    platform issued it (`assertion_env` or `assertion_file`) presented by the public client `client_id`."""
    private_key_env: str | None = None
    """NAME of an environment variable holding the client's private key (PEM), for private_key_jwt."""
    signing_algorithm: str = "RS256"
    """The JWT algorithm that key signs with (RS256, ES256, ...)."""
    issuer: str | None = None
    """identity_assertion: the MCP server's authorization server (configured, never discovered)."""
    idp_token_endpoint: str | None = None
    """identity_assertion: the identity provider's token endpoint, where the ID token is exchanged."""
    idp_client_id: str | None = None
    """identity_assertion: mcpmux's client id at the identity provider, if it asks for one."""
    id_token_env: str | None = None
    """identity_assertion: NAME of an environment variable holding the user's ID token."""
    assertion_env: str | None = None
    """workload_identity: NAME of an environment variable holding the workload's JWT."""
    assertion_file: str | None = None
    """workload_identity: a file holding the workload's JWT, read again for each token (platforms
    such as Kubernetes rotate it there)."""

    @field_validator("client_metadata_url")
    @classmethod
    def _check_metadata_url(cls, value: str | None) -> str | None:
        parts = urlsplit(value) if value is not None else None
        if parts is not None and (parts.scheme != "https" or not parts.netloc or parts.path in ("", "/")):
            raise ValueError("must be an https:// URL with a path, e.g. 'https://example.com/mcpmux/client.json'")
        return value

    @field_validator("client_secret_env", "private_key_env", "id_token_env", "assertion_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        return _env_name(value)

    @model_validator(mode="after")
    def _check_secret_has_client(self) -> OAuthSettings:
        if self.grant == "client_credentials" and (
            self.client_id is None or (self.client_secret_env is None) == (self.private_key_env is None)
        ):
            raise ValueError(
                "grant = \"client_credentials\" needs 'client_id' and one of 'client_secret_env' and 'private_key_env'"
            )
        if self.private_key_env is not None and self.grant != "client_credentials":
            raise ValueError("'private_key_env' is for grant = \"client_credentials\"")
        needed = [self.client_id, self.client_secret_env, self.issuer, self.idp_token_endpoint, self.id_token_env]
        if self.grant == "identity_assertion" and None in needed:
            raise ValueError(
                "grant = \"identity_assertion\" needs 'client_id', 'client_secret_env', 'issuer', "
                "'idp_token_endpoint' and 'id_token_env'"
            )
        if self.grant == "workload_identity" and (
            self.client_id is None or (self.assertion_env is None) == (self.assertion_file is None)
        ):
            raise ValueError(
                "grant = \"workload_identity\" needs 'client_id' and one of 'assertion_env' and 'assertion_file'"
            )
        if (self.assertion_env is not None or self.assertion_file is not None) and self.grant != "workload_identity":
            raise ValueError("'assertion_env' and 'assertion_file' are for grant = \"workload_identity\"")
        if self.grant == "workload_identity" and self.client_secret_env is not None:
            raise ValueError('grant = "workload_identity" is a public client: its JWT is its credential, no secret')
        if self.client_secret_env is not None and self.client_id is None:
            raise ValueError("'client_secret_env' needs 'client_id' (the client that secret belongs to)")
        if self.client_metadata_url is not None and self.client_id is not None:
            raise ValueError("'client_id' and 'client_metadata_url' each name the client: set one of them")
        return self


class ResourceServerSettings(BaseModel):
    """`[http.oauth]`: the HTTP front as an OAuth 2.1 resource server, its clients' tokens checked
    at the authorization server's introspection endpoint (RFC 7662) or, for JWT access tokens
    (RFC 9068), against the keys it publishes at `jwks_uri`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str
    """The authorization server clients get tokens from (named in `/.well-known/oauth-protected-resource`)."""
    audience: str
    """mcpmux's own MCP URL as clients reach it, e.g. "https://mux.example.com/mcp": a token must be
    issued for it (RFC 8707 `resource`, the introspection's `aud`)."""
    introspection_endpoint: str | None = None
    jwks_uri: str | None = None
    """Where the issuer's signing keys are (JSON Web Key Set): tokens are then JWTs checked here."""
    client_id: str | None = None
    """mcpmux's client at the authorization server, when its introspection endpoint wants one."""
    client_secret_env: str | None = None
    """NAME of an environment variable holding that client's secret."""
    scopes: list[str] = Field(default_factory=list)
    """Scopes every token must carry; empty: any."""

    @field_validator("issuer", "audience", "introspection_endpoint", "jwks_uri")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_one_source(self) -> ResourceServerSettings:
        if (self.introspection_endpoint is None) == (self.jwks_uri is None):
            raise ValueError("give one of 'introspection_endpoint' (any token) and 'jwks_uri' (JWT access tokens)")
        return self

    @field_validator("client_secret_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        return _env_name(value)


def _env_name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("must be the NAME of an environment variable (letters, digits, _), not a secret")
    return value
