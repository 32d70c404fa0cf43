"""The bearer token `serve` sends an OAuth-protected upstream: read from the token store, refreshed
before it lapses and after a 401, and a `needs login` error when no usable one is left.

    request ─▶ stored login? ── none ──▶ auth "oauth": needs login
        │                       └──────▶ auth "auto": sent bare; a 401 asking for OAuth: needs login
        ▼
    due to lapse? ── yes ─▶ [store lock] read again: another process refreshed? use it : refresh
        ▼
    sent with its token ── 401 ─▶ the same, once; a second 401: needs login
                         └─ 403 insufficient_scope ─▶ the scope it names kept for the next login: needs login

The interactive login (discovery, registration, PKCE) is `mcpmux login`'s (`login_flow`); `serve`
never opens a browser. A refresh runs under the store's lock, so several mcpmux processes sharing a
login refresh it once: the others find the new token when the lock is theirs. With `grant =
"client_credentials"` or `"identity_assertion"` there is no login: mcpmux gets tokens itself as a machine
client (`MachineOAuth`), or as the user through the identity provider (`identity_assertion`).
A login whose token is DPoP-bound sends it as `Authorization: DPoP`, each request (and each refresh)
signed with the login's key (`dpop`); the machine grants client credentials and workload identity
use DPoP the same way where the authorization server advertises it (`dpop_provider`).
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import AsyncGenerator
from urllib.parse import quote

import anyio
import httpx2
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.client.auth.utils import extract_field_from_www_auth, extract_scope_from_www_auth, union_scopes
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import ValidationError

from mcpmux.core.config import ServerConfig
from mcpmux.errors import ConfigError, UpstreamUnavailableError
from mcpmux.upstream.oauth.dpop import DpopKey, parse_token, signed
from mcpmux.upstream.oauth.dpop_provider import DpopProvider
from mcpmux.upstream.oauth.id_jag import id_jag_fetcher
from mcpmux.upstream.oauth.stored_login import StoredLogin
from mcpmux.upstream.oauth.token_store import TokenStore, default_home
from mcpmux.upstream.oauth.workload import WorkloadIdentityProvider, file_assertion, static_assertion

logger = logging.getLogger(__name__)

STORE_POLL = 1.0
"""Seconds between looks at the token store while an upstream waits for `mcpmux login`."""

STEP_UP = "step_up_scope"
"""The stored login's key for the scopes a server asked for beyond the ones granted (403 insufficient_scope)."""

_config_file: str | None = None


def name_config_file(path: str) -> None:
    """The config file the `mcpmux login` hint names (the CLI calls this with the file it serves)."""
    global _config_file
    _config_file = path


def login_command(name: str) -> str:
    return f"mcpmux login {name}" + (f" --config {_config_file}" if _config_file else "")


def token_store() -> TokenStore:
    return TokenStore(default_home() / "oauth")


class NeedsLoginError(UpstreamUnavailableError):
    """No usable token for an OAuth-protected upstream: a person has to run `mcpmux login`."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"upstream {name} needs login: run `{login_command(name)}`")
        self.why = why


class UpstreamOAuth(httpx2.Auth):
    """The httpx auth of one HTTP upstream whose `auth` is not "none"."""

    def __init__(self, name: str, config: ServerConfig, store: TokenStore | None = None) -> None:
        self.name = name
        self.url = config.url or ""
        self.mode = config.auth
        secret_env = config.oauth.client_secret_env if config.oauth is not None else None
        self._secret = os.environ.get(secret_env) if secret_env else None
        self.store = store or token_store()
        self._login: StoredLogin | None = None
        self._seen: int | None = -1
        self._dpop: tuple[str, DpopKey | None] | None = None
        """The stored login's DPoP key (its PEM, and it), kept across requests for the nonces servers gave it."""
        self.needs_login: NeedsLoginError | None = None
        """Set when the last request found no usable token (cleared when the store changes)."""

    @property
    def active(self) -> bool:
        """Whether requests carry a token (or must): the fast path's raw lane, which sends none, stays off."""
        return self.mode == "oauth" or self._current() is not None

    def describe(self) -> str:
        """The auth state, as `mcpmux tools` prints it."""
        login = self._current()
        if self.needs_login is not None:
            return "oauth, needs login"
        if login is None:
            return "oauth, not logged in" if self.mode == "oauth" else "auto (no login stored)"
        if login.expires_at is None:
            return "oauth, logged in"
        left = login.expires_at - time.time()
        return f"oauth, logged in (token {'lapsed' if left <= 0 else f'expires in {_minutes(left)}'})"

    async def changed(self) -> None:
        """Return once the stored login changes (`mcpmux login` or `logout` ran, here or elsewhere)."""
        start = self.store.version(self.name, self.url)
        while True:
            await anyio.sleep(STORE_POLL)
            if self.store.version(self.name, self.url) != start:
                break
        self.needs_login = None

    def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        return signed(self._flow(request), self._dpop_key)

    def _dpop_key(self) -> DpopKey | None:
        login = self._current()
        pem = login.dpop_key if login is not None else None
        if pem is None:
            return None
        if self._dpop is None or self._dpop[0] != pem:
            self._dpop = (pem, DpopKey.from_pem(pem))
        return self._dpop[1]

    async def _flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        login = self._current()
        if login is None:
            if self.mode == "oauth":
                raise self._refuse("no login stored")
            response = yield request
            if response.status_code == 401 and "resource_metadata" in response.headers.get("www-authenticate", ""):
                raise self._refuse("the server asks for OAuth and no login is stored")
            return
        for attempt in range(2):
            if attempt or login.refresh_due():
                stale = login.token.access_token
                async with self.store.locked(self.name, self.url):
                    fresh = self._current(reread=True)
                    if fresh is None:
                        raise self._refuse("the stored login was removed")
                    if fresh.token.access_token != stale and not fresh.refresh_due():
                        login = fresh  # another process, or another request here, refreshed it meanwhile
                    else:
                        response = yield self._refresh_request(fresh)
                        await response.aread()
                        login = self._refreshed(fresh, response)
            request.headers["Authorization"] = f"{login.scheme} {login.token.access_token}"
            response = yield request
            if response.status_code == 403 and extract_field_from_www_auth(response, "error") == "insufficient_scope":
                raise self._step_up(login, extract_scope_from_www_auth(response))
            if response.status_code != 401:
                return
        raise self._refuse("the server refused a freshly refreshed token")

    def _current(self, *, reread: bool = False) -> StoredLogin | None:
        """The stored login, read again whenever the file changed (a refresh or login by another process)."""
        version = self.store.version(self.name, self.url)
        if reread or version != self._seen:
            record = self.store.load(self.name, self.url)
            self._login = StoredLogin.from_record(record) if record is not None else None
            self._seen = version
        return self._login

    def _refresh_request(self, login: StoredLogin) -> httpx2.Request:
        if not login.token.refresh_token:
            raise self._refuse("the token lapsed and the server issued no refresh token")
        data = {"grant_type": "refresh_token", "refresh_token": login.token.refresh_token}
        if login.resource:
            data["resource"] = login.resource  # RFC 8707: the token stays bound to this server
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        client = login.client
        secret = self._secret or client.client_secret
        if secret and client.token_endpoint_auth_method == "client_secret_basic":
            pair = f"{quote(client.client_id, safe='')}:{quote(secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            data["client_id"] = client.client_id
            if secret:
                data["client_secret"] = secret
        return httpx2.Request("POST", login.token_endpoint, data=data, headers=headers)

    def _refreshed(self, login: StoredLogin, response: httpx2.Response) -> StoredLogin:
        if response.status_code in (400, 401):  # invalid_grant, invalid_client: only a new login helps
            raise self._refuse(f"the authorization server refused the refresh (HTTP {response.status_code})")
        if response.status_code != 200:
            raise UpstreamUnavailableError(
                f"upstream {self.name}: its authorization server answered a token refresh with HTTP "
                f"{response.status_code}; mcpmux retries the connection"
            )
        try:
            token, bound = parse_token(response.content)
        except (ValidationError, ValueError):
            raise self._refuse("the authorization server's refresh answer held no token") from None
        login = login.refreshed(token, bound=bound)
        self.store.save(self.name, self.url, login.to_record(keep_secret=self._secret is None))
        self._current()
        logger.info("upstream %r: token refreshed", self.name)
        return login

    def _step_up(self, login: StoredLogin, needed: str | None) -> NeedsLoginError:
        """The token lacks a scope the server needs: the next `mcpmux login` asks for it too (`STEP_UP`)."""
        scope = union_scopes(login.token.scope, needed) or ""
        record = self.store.load(self.name, self.url)
        if record is not None:
            self.store.save(self.name, self.url, {**record, STEP_UP: scope})
        return self._refuse(f"the server needs scope {scope!r}, more than the login granted; log in again to grant it")

    def _refuse(self, why: str) -> NeedsLoginError:
        self.needs_login = NeedsLoginError(self.name, why)
        logger.debug("upstream %r needs login: %s", self.name, why)
        return self.needs_login


class MemoryTokenStorage:
    """The SDK's `TokenStorage`, in memory: for one login (`log_in` stores the outcome itself)."""

    def __init__(self, client: OAuthClientInformationFull | None = None) -> None:
        self.tokens: OAuthToken | None = None
        self.client = client

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class MachineOAuth(UpstreamOAuth):
    """A grant with no person and no login, through the SDK's providers. `client_credentials`: tokens
    from the authorization server the upstream's 401 names, for the machine client `client_id`, its
    secret sent with HTTP Basic or a private_key_jwt assertion signed with its key.
    `identity_assertion`: from the configured `issuer`, for an ID-JAG the identity provider gives
    for the user's ID token (`id_jag`). `workload_identity`: for the workload's own JWT (`workload`).
    Tokens live in memory: a lapsed or refused one is fetched again."""

    def __init__(self, name: str, config: ServerConfig) -> None:
        super().__init__(name, config)
        settings = config.oauth
        assert settings is not None  # the config's validator saw to these
        assert settings.client_id is not None
        storage = MemoryTokenStorage()
        provider: httpx2.Auth
        self._grant = settings.grant
        if settings.grant == "identity_assertion":
            assert settings.issuer is not None
            assert settings.idp_token_endpoint is not None
            id_token = _required_env(name, "id_token_env", settings.id_token_env or "")
            provider = IdentityAssertionOAuthProvider(
                self.url,
                storage,
                settings.client_id,
                _required_env(name, "client_secret_env", settings.client_secret_env or ""),
                settings.issuer,
                id_jag_fetcher(settings.idp_token_endpoint, id_token, settings.idp_client_id),
                _scope(settings.scopes),
                "client_secret_basic",
            )
        elif settings.grant == "workload_identity":
            if settings.assertion_file is not None:
                assertion = file_assertion(settings.assertion_file)
            else:
                assertion = static_assertion(_required_env(name, "assertion_env", settings.assertion_env or ""))
            provider = WorkloadIdentityProvider(
                self.url, storage, settings.client_id, assertion, _scope(settings.scopes)
            )
        elif settings.private_key_env is not None:
            key = _required_env(name, "private_key_env", settings.private_key_env)
            signer = SignedJWTParameters(
                issuer=settings.client_id,
                subject=settings.client_id,
                signing_key=key,
                signing_algorithm=settings.signing_algorithm,
            )
            provider = _PrivateKeyJWT(
                self.url, storage, settings.client_id, signer.create_assertion_provider(), _scope(settings.scopes)
            )
        else:
            secret = _required_env(name, "client_secret_env", settings.client_secret_env or "")
            provider = _ClientCredentials(
                self.url, storage, settings.client_id, secret, "client_secret_basic", _scope(settings.scopes)
            )
        self._provider = provider

    @property
    def active(self) -> bool:
        return True

    def describe(self) -> str:
        return f"oauth, {self._grant.replace('_', ' ')}"

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        flow = self._provider.async_auth_flow(request)
        try:
            sent = await flow.__anext__()
            while True:
                response = yield sent
                sent = await flow.asend(response)
        except StopAsyncIteration:
            return


class _ClientCredentials(DpopProvider, ClientCredentialsOAuthProvider):
    """The SDK's client-credentials grant (a secret), with DPoP where the authorization server advertises it."""


class _PrivateKeyJWT(DpopProvider, PrivateKeyJWTOAuthProvider):
    """The SDK's client-credentials grant (private_key_jwt), with DPoP where the authorization server advertises it."""


def _required_env(name: str, key: str, variable: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise ConfigError(f"servers.{name}.oauth.{key}: environment variable {variable} is not set")
    return value


def _scope(scopes: list[str]) -> str | None:
    return " ".join(scopes) or None


def upstream_oauth(name: str, config: ServerConfig) -> UpstreamOAuth | None:
    """The auth of an HTTP upstream that may use OAuth; None for stdio and `auth = "none"`."""
    if config.transport != "http" or config.auth == "none":
        return None
    if config.oauth is not None and config.oauth.grant != "authorization_code":
        return MachineOAuth(name, config)
    return UpstreamOAuth(name, config)


def needs_login(err: BaseException) -> NeedsLoginError | None:
    """The `NeedsLoginError` that ended a connection, also from inside the transport's task groups."""
    if isinstance(err, NeedsLoginError):
        return err
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = needs_login(inner)
            if found is not None:
                return found
    return None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}m" if seconds >= 60 else f"{seconds:.0f}s"
