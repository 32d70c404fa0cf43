"""mcpmux as the client under test: what the suite runs for each client scenario, as a user would.

    MCP_CONFORMANCE_SCENARIO=tools_call python mcpmux_client.py http://localhost:PORT/mcp

The suite starts a mock server per scenario and runs this with its URL (and, for some scenarios,
`MCP_CONFORMANCE_CONTEXT`: pre-registered client credentials, a private key, an identity
provider's token, a workload's JWT). It writes an mcpmux config naming that server `s` (`prefix_single = false`),
then uses only mcpmux's own commands: `mcpmux login s --no-browser` where the server asks for
OAuth (the authorization URL it prints is opened by a plain HTTP client standing in for the
browser; the suite's authorization servers approve at once), `mcpmux tools --json`, and `mcpmux call
--accept-defaults` for every tool listed, logging in again and calling once more where the call says it needs a
login (a server asking for more scope). Its exit status is the first failing command's (0 when all
passed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2

MCPMUX = [sys.executable, "-m", "mcpmux"]
TIMEOUT = 60.0
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
LIST_ONLY = {"json-schema-ref-no-deref"}
"""Scenarios whose server answers only `tools/list` (the suite's own client only lists there)."""
SCHEMA_ECHO, SCHEMA_FOCAL = "json_schema_echo", "json_schema_2020_12_tool"
"""json-schema-2020-12-preservation: the focal tool's schema, as listed, is passed back to the echo tool."""


def config_for(url: str, scenario: str, context: dict[str, Any]) -> str:
    """The mcpmux config (TOML) for the scenario's server, with the credentials its context gives."""
    lines = ["[mux]", "prefix_single = false", "meta_tools = false", 'tool_search = "off"', "startup_timeout = 20", ""]
    lines += ["[inference]", 'backend = "off"', "", "[servers.s]", f"url = {json.dumps(url)}"]
    oauth = []
    if scenario.startswith("auth/") and not context.get("client_id"):
        # Where mcpmux's client metadata document would be published (the suite's own client names
        # this one); used only where the authorization server takes such documents.
        oauth.append(f"client_metadata_url = {json.dumps(CLIENT_METADATA_URL)}")
    if context.get("client_id"):
        oauth.append(f"client_id = {json.dumps(context['client_id'])}")
    if context.get("client_secret"):
        oauth.append('client_secret_env = "CONFORMANCE_CLIENT_SECRET"')
    if context.get("private_key_pem"):
        oauth.append('private_key_env = "CONFORMANCE_PRIVATE_KEY"')
        oauth.append(f"signing_algorithm = {json.dumps(context.get('signing_algorithm') or 'ES256')}")
    if scenario.startswith("auth/client-credentials"):
        oauth.append('grant = "client_credentials"')
    if context.get("valid_jwt"):  # workload identity federation: the workload's JWT, no login
        oauth.append('grant = "workload_identity"')
        oauth.append('assertion_env = "CONFORMANCE_WORKLOAD_JWT"')
    if context.get("idp_token_endpoint"):  # enterprise-managed authorization (cross-app access)
        oauth.append('grant = "identity_assertion"')
        oauth.append(f"issuer = {json.dumps(authorization_server(url))}")
        oauth.append(f"idp_token_endpoint = {json.dumps(context['idp_token_endpoint'])}")
        oauth.append(f"idp_client_id = {json.dumps(context.get('idp_client_id', ''))}")
        oauth.append('id_token_env = "CONFORMANCE_ID_TOKEN"')
    return "\n".join([*lines, *(["", "[servers.s.oauth]", *oauth] if oauth else []), ""])


def authorization_server(url: str) -> str:
    """The MCP server's authorization server, as its protected-resource metadata names it: what a user
    of enterprise-managed authorization writes into `issuer` (mcpmux never discovers it there)."""
    parts = urlsplit(url)
    metadata = f"{parts.scheme}://{parts.netloc}/.well-known/oauth-protected-resource{parts.path}"
    servers = httpx2.get(metadata, timeout=TIMEOUT).json()["authorization_servers"]
    return str(servers[0])


def log_in(config: Path, env: dict[str, str]) -> int:
    """`mcpmux login s --no-browser`, with the printed URL followed as a browser would."""
    started = time.monotonic()
    login = subprocess.Popen(
        [*MCPMUX, "login", "s", "--no-browser", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert login.stderr is not None

    def follow() -> None:
        assert login.stderr is not None
        for line in login.stderr:
            sys.stderr.write(line)
            if re.match(r"^https?://", line.strip()):
                try:
                    httpx2.get(line.strip(), follow_redirects=True, timeout=TIMEOUT)
                except httpx2.HTTPError as err:
                    sys.stderr.write(f"mcpmux_client: opening the authorization URL failed: {err}\n")

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        login.wait(timeout=TIMEOUT)  # not `communicate`: it would read the stderr `follow` reads
    except subprocess.TimeoutExpired:
        login.kill()
        login.wait()
    reader.join(timeout=5)
    sys.stderr.write(f"$ mcpmux login s -> {login.returncode} ({time.monotonic() - started:.1f} s)\n")
    assert login.stdout is not None
    sys.stderr.write(login.stdout.read())
    return login.returncode


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    took = f"{time.monotonic() - started:.1f} s"
    sys.stderr.write(f"$ mcpmux {' '.join(command[3:])}\n-> {done.returncode} ({took})\n{done.stdout}{done.stderr}")
    return done


def arguments_for(tool: str, context: dict[str, Any], listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What to call each mock tool with: the calls the scenario's context names for it (`toolCalls`,
    as the suite gives its own client); the echo tool of json-schema-2020-12-preservation gets the
    other tool's input schema as `mcpmux tools --json` printed it; `add_numbers` adds two numbers;
    the others take nothing."""
    named = [call.get("arguments") or {} for call in context.get("toolCalls") or [] if call.get("name") == tool]
    if named:
        return named
    if tool == SCHEMA_ECHO:
        return [{"schema": entry["inputSchema"]} for entry in listed if entry["name"] == SCHEMA_FOCAL]
    return [{"a": 5, "b": 3} if tool == "add_numbers" else {}]


def call_tool(config: Path, env: dict[str, str], tool: str, arguments: dict[str, Any]) -> int:
    """`mcpmux call` of one tool, with one more login and call where it says it needs a login."""
    # --accept-defaults: the person running the script takes a form's defaults where it has one
    # for every required field (elicitation-sep1034-client-defaults); other elicitations are declined.
    call = [*MCPMUX, "call", "--accept-defaults", "--config", str(config), tool, json.dumps(arguments)]
    called = run(call, env)
    if called.returncode != 0 and "needs login: run `mcpmux login" in called.stderr:
        # What the error tells a person to do (a server asking for more scope): log in, call again.
        code = log_in(config, env)
        called = run(call, env) if code == 0 else called
    return called.returncode


def main() -> int:
    url = sys.argv[1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context: dict[str, Any] = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    with tempfile.TemporaryDirectory(prefix="mcpmux-conformance-") as home:
        config = Path(home) / "mcpmux.toml"
        config.write_text(config_for(url, scenario, context))
        env = dict(os.environ, MCPMUX_HOME=home)
        env["CONFORMANCE_CLIENT_SECRET"] = str(context.get("client_secret", ""))
        env["CONFORMANCE_PRIVATE_KEY"] = str(context.get("private_key_pem", ""))
        env["CONFORMANCE_ID_TOKEN"] = str(context.get("idp_id_token", ""))
        env["CONFORMANCE_WORKLOAD_JWT"] = str(context.get("valid_jwt", ""))
        machine = "client-credentials" in scenario or "idp_token_endpoint" in context or "valid_jwt" in context
        if scenario.startswith("auth/") and not machine:
            code = log_in(config, env)
            if code != 0:
                return code
        tools_command = [*MCPMUX, "tools", "--json", "--config", str(config)]
        listing = run(tools_command, env)
        if listing.returncode != 0 and "needs login: run `mcpmux login" in listing.stdout + listing.stderr:
            # As after a call (below): the server wants a new login (its authorization server moved, say).
            code = log_in(config, env)
            listing = run(tools_command, env) if code == 0 else listing
        if listing.returncode != 0:
            return listing.returncode
        listed: list[dict[str, Any]] = json.loads(listing.stdout)
        tools = [entry["name"] for entry in listed]
        if scenario in LIST_ONLY:
            return 0
        for tool in tools:
            for arguments in arguments_for(tool, context, listed):
                code = call_tool(config, env, tool, arguments)
                if code != 0:
                    return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
