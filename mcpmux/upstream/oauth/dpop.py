"""DPoP (RFC 9449): upstream OAuth tokens bound to a key pair of mcpmux's, so that a stolen token is
useless without the key.

    token request ──▶ + DPoP: proof(POST, token endpoint)                ──▶ token_type "DPoP"
    MCP request   ──▶ Authorization: DPoP <token> + DPoP: proof(ath = hash of the token)
    either answered "use_dpop_nonce" with a DPoP-Nonce ──▶ signed again with that nonce, once

Only where the authorization server advertises it: its metadata's `dpop_signing_alg_values_supported`
lists ES256 (`noting_dpop_support` reads that field as the SDK's discovery fetches the document; the
SDK's `OAuthMetadata` drops it). Elsewhere no proof is sent, and the token is a plain bearer one.
One ES256 key pair per upstream login, generated at `mcpmux login` and stored with its tokens
(the token store's record, written whole and owner-only). A proof is a JWT signed with PyJWT,
carrying the public key in its header; every proof has its own `jti`. A server's latest nonce is
remembered per origin (the authorization server's and the MCP server's are separate) and sent with
every later proof there. `signed` wraps an httpx auth flow (the SDK's provider at login, mcpmux's
own while serving) so that every request it makes is signed the same way.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import httpx2
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from mcp.client.auth.utils import extract_field_from_www_auth
from mcp.shared.auth import OAuthToken

ALGORITHM = "ES256"
USE_NONCE = "use_dpop_nonce"
ADVERTISED = "dpop_signing_alg_values_supported"
METADATA_DOCUMENTS = ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration")
"""Where authorization server metadata is published (RFC 8414, OpenID Connect Discovery), anywhere in the path."""


class DpopKey:
    """One login's key pair, and the nonces servers asked its proofs to carry."""

    def __init__(self, private: ec.EllipticCurvePrivateKey) -> None:
        self._private = private
        self._jwk: dict[str, Any] = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
        self.nonces: dict[str, str] = {}
        """The latest `DPoP-Nonce` of each origin (scheme://host:port)."""

    @classmethod
    def generate(cls) -> DpopKey:
        return cls(ec.generate_private_key(ec.SECP256R1()))

    @classmethod
    def from_pem(cls, pem: str) -> DpopKey | None:
        """The stored key; None when the record holds something else (a new login replaces it)."""
        try:
            private = serialization.load_pem_private_key(pem.encode("ascii"), password=None)
        except (ValueError, TypeError, UnicodeEncodeError):
            return None
        return cls(private) if isinstance(private, ec.EllipticCurvePrivateKey) else None

    def to_pem(self) -> str:
        return self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode("ascii")

    def proof(self, method: str, url: str, *, access_token: str | None = None) -> str:
        """A fresh proof for `method` on `url` (its query and fragment left out, as `htu` requires)."""
        target = httpx2.URL(url)
        claims: dict[str, Any] = {
            "jti": secrets.token_urlsafe(16),
            "htm": method.upper(),
            "htu": str(target.copy_with(query=None, fragment=None)),
            "iat": int(time.time()),
        }
        if access_token is not None:
            digest = hashlib.sha256(access_token.encode("ascii")).digest()
            claims["ath"] = base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
        nonce = self.nonces.get(_origin(target))
        if nonce is not None:
            claims["nonce"] = nonce
        return jwt.encode(claims, self._private, algorithm=ALGORITHM, headers={"typ": "dpop+jwt", "jwk": self._jwk})

    def sign(self, request: httpx2.Request) -> None:
        """Put a fresh proof on a request that needs one: one carrying a DPoP token (bound to it with
        `ath`), or a token request (to get such a token, or refresh one)."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "dpop" and token:
            request.headers["DPoP"] = self.proof(request.method, str(request.url), access_token=token)
        elif is_token_request(request):
            request.headers["DPoP"] = self.proof(request.method, str(request.url))

    def learn(self, request: httpx2.Request, response: httpx2.Response) -> bool:
        """Remember the nonce a response gave; True when it is new (a retry with it may succeed)."""
        nonce = response.headers.get("DPoP-Nonce")
        origin = _origin(request.url)
        if not nonce or self.nonces.get(origin) == nonce:
            return False
        self.nonces[origin] = nonce
        return True


def is_token_request(request: httpx2.Request) -> bool:
    """A request to a token endpoint: a form POST naming a grant type (RFC 6749 §3.2)."""
    if request.method != "POST" or "application/x-www-form-urlencoded" not in request.headers.get("Content-Type", ""):
        return False
    try:
        return b"grant_type=" in request.content
    except httpx2.RequestNotRead:
        return False


async def _asks_for_nonce(request: httpx2.Request, response: httpx2.Response) -> bool:
    """The server refused the proof for want of its nonce: 400 from a token endpoint (RFC 9449 §8),
    401 from a resource server (§9)."""
    if response.status_code == 401:
        return extract_field_from_www_auth(response, "error") == USE_NONCE
    if response.status_code != 400 or not is_token_request(request):
        return False
    try:
        answer = json.loads(await response.aread())
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("error") == USE_NONCE


async def signed(
    flow: AsyncGenerator[httpx2.Request, httpx2.Response], key: Callable[[], DpopKey | None]
) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
    """`flow` (an httpx auth flow) with each of its requests signed by `key()` where it needs a proof,
    and sent once more, signed again, when the server answers with a nonce it wants the proof to carry."""
    try:
        request = await flow.__anext__()
        while True:
            signer = key()
            if signer is not None:
                signer.sign(request)
            response = yield request
            if signer is not None and signer.learn(request, response) and await _asks_for_nonce(request, response):
                signer.sign(request)
                response = yield request
                signer.learn(request, response)
            request = await flow.asend(response)
    except StopAsyncIteration:
        return
    finally:
        await flow.aclose()


async def noting_dpop_support(
    flow: AsyncGenerator[httpx2.Request, httpx2.Response], note: Callable[[bool], None]
) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
    """`flow` (the SDK's OAuth flow), calling `note(advertised)` with each authorization server metadata
    document it reads: whether its `dpop_signing_alg_values_supported` lists ES256. The SDK takes the
    last document it read before its token request, so the last note is the one that counts."""
    try:
        request = await flow.__anext__()
        while True:
            response = yield request
            if request.method == "GET" and response.status_code == 200 and _is_metadata(request.url):
                note(await _advertises_dpop(response))
            request = await flow.asend(response)
    except StopAsyncIteration:
        return
    finally:
        await flow.aclose()


def _is_metadata(url: httpx2.URL) -> bool:
    return any(document in url.path for document in METADATA_DOCUMENTS)


async def _advertises_dpop(response: httpx2.Response) -> bool:
    try:
        document = json.loads(await response.aread())
    except ValueError:
        return False
    algorithms = document.get(ADVERTISED) if isinstance(document, dict) else None
    return isinstance(algorithms, list) and ALGORITHM in algorithms


def parse_token(content: bytes) -> tuple[OAuthToken, bool]:
    """A token endpoint's answer, and whether its token is DPoP-bound (`token_type` "DPoP", which
    the SDK's `OAuthToken`, Bearer only, cannot hold). Raises pydantic's ValidationError or ValueError."""
    answer = json.loads(content)
    if not isinstance(answer, dict):
        raise ValueError("the token answer is not a JSON object")
    bound = str(answer.get("token_type", "")).lower() == "dpop"
    if bound:
        answer = {**answer, "token_type": "Bearer"}
    return OAuthToken.model_validate(answer), bound


def _origin(url: httpx2.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"
