"""`mcpmux login`'s flow: the SDK's OAuth client (discovery, registration, PKCE S256 with the RFC 8707
`resource`) driven by one MCP handshake, with the authorization code caught on a loopback callback.

    handshake ─401─▶ protected-resource metadata ▶ authorization server metadata
              ▶ client: pre-registered ([servers.X.oauth] client_id) or registered (RFC 7591)
              ▶ authorization URL (to the person) ▶ callback on 127.0.0.1 (state checked)
              ▶ token ▶ the handshake again, with it ▶ stored (`token_store`)

Where the authorization server's metadata advertises DPoP (ES256), the token request carries a
proof of a key pair made for this login (`dpop_provider`), stored with the token, which the server
binds to it (`token_type` "DPoP"); elsewhere no proof is sent, no key is stored, and the token is a
bearer one.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, urljoin, urlsplit

import anyio
import httpx2
from anyio.abc import SocketStream
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.exceptions import OAuthFlowError
from mcp.client.auth.utils import union_scopes
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata
from mcp.shared.exceptions import MCPError
from pydantic import AnyUrl

from mcpmux.core.config import ServerConfig
from mcpmux.errors import MuxError
from mcpmux.upstream.oauth.dpop_provider import DpopProvider
from mcpmux.upstream.oauth.legacy_issuer import noting_legacy_issuer
from mcpmux.upstream.oauth.stored_login import StoredLogin
from mcpmux.upstream.oauth.token_store import TokenStore
from mcpmux.upstream.oauth.upstream_auth import STEP_UP, MemoryTokenStorage

CALLBACK_PATH = "/callback"
LOGIN_TIMEOUT = 300.0
"""Seconds a login waits for the person to approve it in the browser."""

_PAGE = "HTTP/1.1 {status}\r\ncontent-type: text/html; charset=utf-8\r\nconnection: close\r\n\r\n<p>{text}</p>\n"


class LoginError(MuxError):
    """The login did not complete; the message says why and what to do."""

    exit_code = 1


@dataclass(slots=True)
class _Callback:
    """The loopback listener the authorization server redirects the browser to."""

    port: int
    expected_state: str | None = None
    result: AuthorizationCodeResult | None = None
    failure: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    async def handle(self, stream: SocketStream) -> None:
        async with stream:
            with anyio.move_on_after(10):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 16384:
                    head += await stream.receive()
                status, text = self._answer(head.split(b"\r\n", 1)[0].decode("latin-1"))
                await stream.send(_PAGE.format(status=status, text=text).encode("utf-8"))

    def _answer(self, request_line: str) -> tuple[str, str]:
        parts = request_line.split(" ")
        target = urlsplit(parts[1] if len(parts) == 3 else "")
        if parts[0] != "GET" or target.path != CALLBACK_PATH:
            return "404 Not Found", "Not the mcpmux login callback."
        query = {key: values[0] for key, values in parse_qs(target.query).items()}
        state = query.get("state")
        if self.expected_state is None or state is None or not secrets.compare_digest(state, self.expected_state):
            # Not the answer to the login this process started (a stale tab, or a forged request): ignored.
            return "400 Bad Request", "This callback's state does not match the login mcpmux started; it was ignored."
        if self.done.is_set():
            return "400 Bad Request", "This login already finished."
        if "error" in query:
            detail = query.get("error_description", "")
            self.failure = (
                f"the authorization server refused the login: {query['error']}{f' ({detail})' if detail else ''}"
            )
            self.done.set()
            return "400 Bad Request", "The login was refused; see the terminal."
        if not query.get("code"):
            return "400 Bad Request", "The callback carries no authorization code."
        self.result = AuthorizationCodeResult(code=query["code"], state=state, iss=query.get("iss"))
        self.done.set()
        return "200 OK", "Logged in to mcpmux. You can close this tab."

    async def wait(self) -> AuthorizationCodeResult:
        with anyio.move_on_after(LOGIN_TIMEOUT):
            await self.done.wait()
        if self.failure is not None:
            raise LoginError(self.failure)
        if self.result is None:
            raise LoginError(f"no answer reached {self.redirect_uri} within {LOGIN_TIMEOUT:g}s; run the login again")
        return self.result


class _Provider(DpopProvider):
    """The SDK's provider, asking for the configured scopes where some are (it would take the server's),
    sending a pre-registered client's secret the way the authorization server takes it, with DPoP
    where the authorization server advertises it (which the SDK lacks), and taking a 2025-03-26
    server's own issuer (`legacy_issuer`)."""

    scopes: str | None = None
    preregistered: bool = False
    legacy_issuer: str | None = None
    """The issuer a server with no protected-resource metadata names on its own origin."""

    def _unsigned_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        return noting_legacy_issuer(super()._unsigned_flow(request), self.context.server_url, self._note_legacy_issuer)

    def _note_legacy_issuer(self, issuer: str) -> None:
        self.legacy_issuer = issuer

    def _expected_issuer(self) -> str:
        if self.context.auth_server_url is None and self.legacy_issuer is not None:
            return self.legacy_issuer
        return super()._expected_issuer()

    async def _perform_authorization(self) -> httpx2.Request:
        if self.scopes:
            self.context.client_metadata.scope = self.scopes
        client, metadata = self.context.client_info, self.context.oauth_metadata
        if self.preregistered and client is not None and client.client_secret:
            supported = metadata.token_endpoint_auth_methods_supported if metadata is not None else None
            client.token_endpoint_auth_method = secret_method(supported)
        return await super()._perform_authorization()


def secret_method(supported: list[str] | None) -> Literal["client_secret_basic", "client_secret_post"]:
    """How a pre-registered client sends its secret to the token endpoint: in the form where the
    server takes that, else with HTTP Basic (RFC 8414: what a server that names no method supports)."""
    return "client_secret_post" if supported and "client_secret_post" in supported else "client_secret_basic"


async def log_in(
    name: str, server: ServerConfig, store: TokenStore, show_url: Callable[[str], Awaitable[None]]
) -> StoredLogin:
    """Log in to upstream `name` and store the tokens; `show_url` hands the authorization URL to the person."""
    settings = server.oauth
    port = settings.redirect_port if settings is not None and settings.redirect_port else 0
    try:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    except OSError as err:
        raise LoginError(
            f"the login callback port {port} ([servers.{name}.oauth] redirect_port) is in use ({err.strerror}): "
            "stop what holds it, or choose another redirect_port"
        ) from None
    try:
        async with listener, anyio.create_task_group() as tasks:
            callback = _Callback(port=listener.extra(anyio.abc.SocketAttribute.local_port))
            tasks.start_soon(listener.serve, callback.handle)
            storage = MemoryTokenStorage(_preregistered(name, server, callback.redirect_uri))

            async def redirect(url: str) -> None:
                callback.expected_state = parse_qs(urlsplit(url).query).get("state", [None])[0]
                await show_url(url)

            provider = _Provider(
                server.url or "",
                OAuthClientMetadata(
                    redirect_uris=[AnyUrl(callback.redirect_uri)],
                    client_name="mcpmux",
                    token_endpoint_auth_method="none",
                    grant_types=["authorization_code", "refresh_token"],
                    response_types=["code"],
                ),
                storage,
                redirect_handler=redirect,
                callback_handler=callback.wait,
                client_metadata_url=settings.client_metadata_url if settings is not None else None,
            )
            configured = " ".join(settings.scopes) if settings is not None and settings.scopes else None
            provider.scopes = union_scopes(configured, _stepped_up(store, name, server))
            provider.preregistered = storage.client is not None
            http = httpx2.AsyncClient(headers=dict(server.headers), auth=provider, timeout=30.0)
            transport = streamable_http_client(server.url or "", http_client=http)
            sdk_log = logging.getLogger(OAuthClientProvider.__module__)
            level = sdk_log.level
            sdk_log.setLevel(logging.CRITICAL)  # it logs each failure with a traceback; the error below says it
            try:
                async with http, Client(transport, mode=server.protocol):
                    pass  # the handshake went through with the new token
            finally:
                sdk_log.setLevel(level)
            tasks.cancel_scope.cancel()
    except Exception as err:
        failure = _worded(name, server.url or "", err)
        if failure is None:
            raise
        raise failure from None
    if storage.tokens is None or storage.client is None:
        raise LoginError(
            f"upstream {name} answered without asking for OAuth: nothing to log in to "
            '(set auth = "none" for it if it needs no login)'
        )
    context = provider.context
    metadata = context.oauth_metadata
    token_endpoint = (
        str(metadata.token_endpoint)
        if metadata is not None and metadata.token_endpoint
        else urljoin(context.get_authorization_base_url(context.server_url), "/token")
    )
    resource = context.get_resource_url() if context.should_include_resource_param(context.protocol_version) else None
    key = provider.dpop.to_pem() if provider.dpop_advertised else None  # refreshes are signed only with one
    tokens, client, bound = storage.tokens, storage.client, provider.bound
    login = StoredLogin.issued(tokens, client, token_endpoint, resource, dpop_key=key, bound=bound)
    preregistered = settings is not None and settings.client_secret_env is not None
    store.save(name, server.url or "", login.to_record(keep_secret=not preregistered))
    return login


def _stepped_up(store: TokenStore, name: str, server: ServerConfig) -> str | None:
    """The scopes the server asked for beyond the last login's (a 403 `insufficient_scope` while serving)."""
    record = store.load(name, server.url or "")
    return str(record[STEP_UP]) if record is not None and record.get(STEP_UP) else None


def _worded(name: str, url: str, err: BaseException) -> LoginError | None:
    """A failed login, in words the person can act on; None for a bug (it is raised as it is)."""
    while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
        err = err.exceptions[0]
    if isinstance(err, LoginError):
        return err
    if isinstance(err, httpx2.ConnectError):
        return LoginError(f"cannot reach {url} for upstream {name} ({err}): is the server up, and its URL right?")
    if isinstance(err, OAuthFlowError):  # token and registration errors too
        return LoginError(f"the login to upstream {name} failed: {err}")
    if isinstance(err, httpx2.HTTPError | MCPError):
        return LoginError(f"upstream {name} at {url} failed during the login: {type(err).__name__}: {err}")
    return None


def _preregistered(name: str, server: ServerConfig, redirect_uri: str) -> OAuthClientInformationFull | None:
    """The configured client (`client_id`, its secret from the environment); None: register one."""
    settings = server.oauth
    if settings is None or settings.client_id is None:
        return None
    secret = None
    if settings.client_secret_env is not None:
        secret = os.environ.get(settings.client_secret_env)
        if not secret:
            raise LoginError(
                f"servers.{name}.oauth.client_secret_env: environment variable {settings.client_secret_env} "
                "is not set (set it to the client's secret)"
            )
    return OAuthClientInformationFull(
        client_id=settings.client_id,
        client_secret=secret,
        token_endpoint_auth_method=secret_method(None) if secret else "none",  # the server's metadata may change it
        redirect_uris=[AnyUrl(redirect_uri)],
        grant_types=["authorization_code", "refresh_token"],
    )
