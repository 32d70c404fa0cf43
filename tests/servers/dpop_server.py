"""An MCP server that takes DPoP-bound tokens only (RFC 9449), with its own authorization server,
for the tests: `python dpop_server.py PORT TTL [bearer]`.

The authorization server registers clients dynamically, grants client credentials to any client,
approves every authorization at once
(a redirect to the client's redirect_uri with the code, PKCE S256 checked), and issues access
tokens (TTL seconds) and rotating refresh tokens bound to the key of the DPoP proof on the token
request; a token request without a valid proof is refused. The MCP endpoint (`/mcp`) takes only
`Authorization: DPoP <token>` with a proof of that key for that request (`htm`, `htu`, `ath`, a
`jti` never seen before). Both demand their own nonce (`DPoP-Nonce`), a different one every
`NONCE_EVERY` proofs, so a client must pick up a new nonce while it works, not only once.

With `bearer` it is the same servers without DPoP, as most are: their metadata does not advertise
it (no `dpop_signing_alg_values_supported`), the authorization server issues bearer tokens and
ignores any proof, and the MCP endpoint takes `Authorization: Bearer`.

Tools: `echo`; `refusals`, what the two refused so far (JSON: reason -> count), which shows
whether a client was challenged and whether it answered each challenge as it should; `proofs`,
how many requests each of the two received with a `DPoP` header (JSON: "token" | "mcp" -> count).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import urlencode

import jwt
import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

PORT = int(sys.argv[1])
TTL = int(sys.argv[2])
BEARER = sys.argv[3:] == ["bearer"]
ADVERTISED = {} if BEARER else {"dpop_signing_alg_values_supported": ["ES256"]}
SCHEME = "Bearer" if BEARER else "DPoP"
URL = f"http://127.0.0.1:{PORT}"
MCP_URL = f"{URL}/mcp"
TOKEN_URL = f"{URL}/token"
NONCE_EVERY = 3
"""Proofs each nonce serves before the server asks for a new one."""

refusals: Counter[str] = Counter()
proofs: Counter[str] = Counter()
clients: dict[str, dict[str, Any]] = {}
codes: dict[str, dict[str, Any]] = {}
access: dict[str, dict[str, Any]] = {}
"""access token -> its key's JWK (public), scopes, expiry."""
refresh: dict[str, dict[str, Any]] = {}
seen_jtis: set[str] = set()


class Nonces:
    """One server's nonce, replaced after `NONCE_EVERY` proofs carried it."""

    def __init__(self) -> None:
        self.current = secrets.token_urlsafe(8)
        self.uses = 0

    def take(self, nonce: object) -> bool:
        if nonce != self.current:
            return False
        self.uses += 1
        if self.uses >= NONCE_EVERY:
            self.current, self.uses = secrets.token_urlsafe(8), 0
        return True


as_nonces, rs_nonces = Nonces(), Nonces()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def check_proof(request: Request, url: str, token: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The proof's public JWK, or why it is refused (the proof alone, before its nonce is looked at)."""
    proof = request.headers.get("dpop")
    if not proof:
        return None, "no DPoP proof"
    try:
        header = jwt.get_unverified_header(proof)
        if header.get("typ") != "dpop+jwt" or header.get("alg") != "ES256" or "d" in header.get("jwk", {"d": 1}):
            return None, "proof header is not a public ES256 dpop+jwt"
        claims = jwt.decode(proof, jwt.PyJWK(header["jwk"], "ES256"), algorithms=["ES256"])
    except (jwt.PyJWTError, KeyError, ValueError):
        return None, "proof does not verify"
    if claims.get("htm") != request.method or claims.get("htu") != url:
        return None, "proof is for another request"
    if abs(time.time() - float(claims.get("iat", 0))) > 60:
        return None, "proof iat out of window"
    if claims.get("jti") in seen_jtis or not claims.get("jti"):
        return None, "proof jti replayed"
    seen_jtis.add(claims["jti"])
    if token is not None and claims.get("ath") != _b64(hashlib.sha256(token.encode("ascii")).digest()):
        return None, "proof ath does not match the token"
    return {"jwk": header["jwk"], "nonce": claims.get("nonce")}, None


async def protected_resource(request: Request) -> Response:
    return JSONResponse({"resource": MCP_URL, "authorization_servers": [URL], **ADVERTISED})


async def authorization_server(request: Request) -> Response:
    return JSONResponse(
        {
            "issuer": URL,
            "authorization_endpoint": f"{URL}/authorize",
            "token_endpoint": TOKEN_URL,
            "registration_endpoint": f"{URL}/register",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
            **ADVERTISED,
        }
    )


async def register(request: Request) -> Response:
    metadata = await request.json()
    client_id = secrets.token_urlsafe(8)
    clients[client_id] = metadata
    return JSONResponse({**metadata, "client_id": client_id, "token_endpoint_auth_method": "none"}, status_code=201)


async def authorize(request: Request) -> Response:
    query = request.query_params
    code = secrets.token_urlsafe(16)
    codes[code] = {"challenge": query["code_challenge"], "scope": query.get("scope", ""), "client": query["client_id"]}
    target = f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query.get('state', '')})}"
    return RedirectResponse(target, status_code=302)


def _token_error(error: str, headers: dict[str, str] | None = None) -> Response:
    refusals[f"token: {error}"] += 1
    return JSONResponse({"error": error}, status_code=400, headers=headers)


async def token(request: Request) -> Response:
    form = await request.form()
    proofs["token"] += "dpop" in request.headers
    proof, why = ({"jwk": None}, None) if BEARER else check_proof(request, TOKEN_URL, None)
    if proof is None:
        return _token_error(f"invalid_dpop_proof ({why})")
    if not BEARER and not as_nonces.take(proof["nonce"]):
        return _token_error("use_dpop_nonce", {"DPoP-Nonce": as_nonces.current})
    if form.get("grant_type") == "authorization_code":
        grant = codes.pop(str(form.get("code")), None)
        verifier = str(form.get("code_verifier", ""))
        if grant is None or _b64(hashlib.sha256(verifier.encode()).digest()) != grant["challenge"]:
            return _token_error("invalid_grant")
        scope = grant["scope"]
    elif form.get("grant_type") == "refresh_token":
        held = refresh.pop(str(form.get("refresh_token")), None)
        if held is None or held["jwk"] != proof["jwk"]:  # a refresh token is bound to the key too
            return _token_error("invalid_grant")
        scope = held["scope"]
    elif form.get("grant_type") == "client_credentials":  # any client: what is tested is the proof
        scope = str(form.get("scope", ""))
    else:
        return _token_error("unsupported_grant_type")
    issued, renewal = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    access[issued] = {"jwk": proof["jwk"], "expires": time.time() + TTL}
    refresh[renewal] = {"jwk": proof["jwk"], "scope": scope}
    answer = {"access_token": issued, "token_type": SCHEME, "expires_in": TTL, "refresh_token": renewal}
    return JSONResponse({**answer, **({"scope": scope} if scope else {})})


auth_app = Starlette(
    routes=[
        Route("/.well-known/oauth-protected-resource/mcp", protected_resource),
        Route("/.well-known/oauth-authorization-server", authorization_server),
        Route("/register", register, methods=["POST"]),
        Route("/authorize", authorize),
        Route("/token", token, methods=["POST"]),
    ]
)

server = MCPServer("dpop-demo")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool(name="refusals")
def list_refusals() -> str:
    """What the authorization server and the MCP endpoint refused so far: reason -> count."""
    return json.dumps(dict(refusals))


@server.tool(name="proofs")
def list_proofs() -> str:
    """How many requests the authorization server ("token") and the MCP endpoint ("mcp") received with a DPoP header."""
    return json.dumps(dict(proofs))


mcp_app = server.streamable_http_app()


def _challenge(error: str, **headers: str) -> Response:
    refusals[f"mcp: {error}"] += 1
    metadata = f'resource_metadata="{URL}/.well-known/oauth-protected-resource/mcp"'
    value = f'{SCHEME} error="{error}", {metadata}' if error != "no token" else f"{SCHEME} {metadata}"
    return JSONResponse({"error": error}, status_code=401, headers={"WWW-Authenticate": value, **headers})


async def guard(request: Request) -> Response | None:
    """None: the request may reach the MCP server; else the refusal."""
    proofs["mcp"] += "dpop" in request.headers
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if not presented:
        return _challenge("no token")
    held = access.get(presented)
    if scheme != SCHEME or held is None or held["expires"] < time.time():
        return _challenge("invalid_token")
    if BEARER:
        return None
    proof, why = check_proof(request, MCP_URL, presented)
    if proof is None:
        return _challenge(f"invalid_dpop_proof ({why})")
    if proof["jwk"] != held["jwk"]:
        return _challenge("invalid_dpop_proof (another key)")
    if not rs_nonces.take(proof["nonce"]):
        return _challenge("use_dpop_nonce", **{"DPoP-Nonce": rs_nonces.current})
    return None


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await mcp_app(scope, receive, send)
    elif scope["path"].startswith("/mcp"):
        refused = await guard(Request(scope, receive))
        await (refused or mcp_app)(scope, receive, send)
    else:
        await auth_app(scope, receive, send)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
