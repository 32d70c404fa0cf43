"""Which of a 2026 upstream's input-required rounds go to the calling client as they are.

SEP-2322: a 2026-07-28 server asks its client for input by answering the request with
`resultType: "input_required"` (input requests under keys of its own, and maybe a `requestState`);
the client retries the same request with `inputResponses` under those keys and the state echoed. A
2026-07-28 client of mcpmux takes those rounds itself: mcpmux hands it the upstream's result
unchanged (`mcpmux.errors.InputRequired`), and the client's retry, routed by the tool's or
prompt's name, goes to the same upstream with its answers and state (`InboundCall.resumes`). So the
keys and the state the client sees are the upstream's, each round's state is the upstream's newest,
and no other client is ever asked.

A round goes to the client only where mcpmux would have asked that client anyway: the client
declared what every request in it needs (`can_answer`), and the upstream's policy sends those
requests to the client (`[servers.X.elicitation] policy = "client"`, a `client*` sampling policy).
Otherwise mcpmux answers the round itself as before (the policy's fallback), on the same call.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from mcpmux.core.config import ServerConfig
from mcpmux.core.inbound import InboundCall, can_answer, current_call
from mcpmux.errors import InputRequired

_RESPONSES: TypeAdapter[types.InputResponses] = TypeAdapter(types.InputResponses)


def relays_round(call: InboundCall | None, requests: types.InputRequests, server: ServerConfig) -> bool:
    """Whether `call`'s client answers this round of `server`'s itself (see the module docstring)."""
    if call is None or not call.takes_rounds:
        return False
    for request in requests.values():
        if isinstance(request, types.CreateMessageRequest) and not server.sampling.asks_client:
            return False
        if isinstance(request, types.ElicitRequest) and server.elicitation.policy != "client":
            return False
        if not can_answer(call.caller.capabilities, request):
            return False
    return True


def resumed() -> dict[str, Any] | None:
    """The running call's answers to a relayed round (`inputResponses`, `requestState`), if it is a retry."""
    call = current_call()
    return call.resumes if call is not None else None


async def get_prompt(
    client: Client, name: str, arguments: dict[str, str] | None, server: ServerConfig
) -> types.GetPromptResult:
    """`prompts/get` of `name` (the upstream's name) on `client`'s session: on a 2026 upstream, a round
    the calling client takes is relayed to it (`InputRequired`) and a retry's answers go with the
    request; any other round is answered as the SDK's client answers it, on the same request."""
    resumes = resumed()
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return await client.get_prompt(name, arguments)
    responses = (
        _RESPONSES.validate_python(resumes["inputResponses"]) if resumes and "inputResponses" in resumes else None
    )
    state = resumes.get("requestState") if resumes else None
    first = await client.session.get_prompt(
        name, arguments, input_responses=responses, request_state=state, allow_input_required=True
    )
    if not isinstance(first, types.InputRequiredResult):
        return first
    call = current_call()
    if relays_round(call, first.input_requests or {}, server):
        assert call is not None  # `relays_round` says so
        call.asked = True
        raise InputRequired(first.model_dump(by_alias=True, mode="json", exclude_none=True), call)
    answers = await answer_inputs(client, first.input_requests or {})
    return await client.get_prompt(name, arguments, input_responses=answers, request_state=first.request_state)


async def answer_inputs(client: Client, requests: types.InputRequests) -> dict[str, types.InputResponse]:
    """The answers to one round's input requests, asked concurrently through the session's callbacks
    (as the SDK's client answers them); a refusal ends the call with the refusal's error."""
    answers: dict[str, types.InputResponse] = {}
    refused: types.ErrorData | None = None

    async def answer(key: str, request: types.InputRequest, tasks: TaskGroup) -> None:
        nonlocal refused
        meta = request.params.meta if request.params is not None else None
        context = ClientRequestContext(session=client.session, request_id=key, meta=meta)
        outcome = await client.session.dispatch_input_request(context, request)
        if isinstance(outcome, types.ErrorData):
            refused = outcome
            tasks.cancel_scope.cancel()
        else:
            answers[key] = outcome

    async with anyio.create_task_group() as tasks:
        for key, request in requests.items():
            tasks.start_soon(answer, key, request, tasks)
    if refused is not None:
        raise MCPError.from_error_data(refused)
    return answers
