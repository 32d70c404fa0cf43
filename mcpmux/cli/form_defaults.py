"""How `mcpmux call` answers an upstream's elicitation: nobody is there to ask, so never unasked.

Elicitation is how a server asks the person for input or consent. `mcpmux call` is a one-shot
command with no person to put the question to, so by default every elicitation is declined (the
fallback of `mcpmux.mux.ask_policies`, whose reason ends up in the printed result). With
`--accept-defaults` the person running the command has said in advance "take the server's
defaults": a form whose every required field has a default (SEP-1034) is accepted with every
default it gives (fields without one are left out, as a person who fills nothing in leaves them).
Anything else stays declined: a form with a required field that has no default (there is no
answer to give), a form with no fields at all (a bare confirmation: no default to take), and a
url-mode request (nobody to open the page). Each default accepted, or declined that could have
been, is said on stderr, so whoever reads the terminal knows what was answered for them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import mcp_types as types

from mcpmux.core.inbound import ClientRequest, ClientResult
from mcpmux.mux.ask_policies import ClientAsker


def defaults_of(schema: dict[str, Any]) -> dict[str, Any] | None:
    """The content a person who keeps every default would submit; None where the form has no such answer."""
    properties: dict[str, Any] = schema.get("properties") or {}
    if not properties:
        return None
    for name in schema.get("required") or []:
        if "default" not in (properties.get(name) or {}):
            return None
    return {
        name: field["default"] for name, field in properties.items() if isinstance(field, dict) and "default" in field
    }


def form_defaults_asker(accept: bool) -> ClientAsker:
    """The asker of `mcpmux call`: accepts forms' defaults where `accept` (`--accept-defaults`) says so."""

    async def ask(upstream: str, request: ClientRequest, limit: float | None) -> ClientResult | None:
        if not isinstance(request, types.ElicitRequest) or not isinstance(
            request.params, types.ElicitRequestFormParams
        ):
            return None
        params = request.params
        content = defaults_of(dict(params.requested_schema))
        if content is None:
            return None
        if not accept:
            print(
                f"mcpmux: declined upstream {upstream!r}'s form ({params.message!r}); every field it requires has a "
                "default: run `mcpmux call --accept-defaults` to accept them",
                file=sys.stderr,
            )
            return None
        print(
            f"mcpmux: accepted upstream {upstream!r}'s form ({params.message!r}) with its defaults: "
            f"{json.dumps(content)}",
            file=sys.stderr,
        )
        return types.ElicitResult(action="accept", content=content)

    return ask
