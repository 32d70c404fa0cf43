"""Inbound JSON-RPC batch arrays (MCP 2025-03-26), transport-independent.

The 2025-03-26 revision lets a client send a JSON array of requests and notifications (and
responses); the server answers with one array holding a response per request, and nothing at all
when the array held no requests. Later revisions removed batches, and the SDK refuses arrays, so the
transports (`batch_stdio`, `batch_http`) split an accepted array into single messages for the SDK
and gather the responses here.

Rules, from JSON-RPC 2.0 and the MCP spec:
- an empty array, an array before `initialize` completed, or an array on a session that negotiated
  any other revision is answered with one `-32600 Invalid Request` error (id null), not an array;
- an element that is not a JSON-RPC message gets its own `-32600` entry in the answer (with its id
  when it has a usable one), and so does a request whose id repeats one already in the batch;
- responses come back in the order of the requests in the array.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from pydantic import ValidationError

BATCH_PROTOCOL_VERSION = "2025-03-26"
Message = dict[str, Any]


def id_key(request_id: object) -> str:
    """A hashable key for a JSON-RPC id that keeps 1 and "1" apart."""
    return json.dumps(request_id)


def error_message(request_id: object, code: int, message: str) -> Message:
    """A JSON-RPC error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def array_refusal(items: list[Any], negotiated: str | None) -> Message | None:
    """The `-32600` error answering a whole array that cannot be accepted, or None when it can."""
    if not items:
        problem = "an empty JSON-RPC batch is invalid: send at least one message"
    elif negotiated is None:
        problem = (
            f"JSON-RPC batches are accepted only on a session that negotiated protocol version "
            f"{BATCH_PROTOCOL_VERSION}, and this one has not completed initialize: send single messages"
        )
    elif negotiated != BATCH_PROTOCOL_VERSION:
        problem = (
            f"JSON-RPC batches exist only in protocol version {BATCH_PROTOCOL_VERSION}; this session "
            f"negotiated {negotiated}, which does not allow them: send one message at a time"
        )
    else:
        return None
    return error_message(None, types.INVALID_REQUEST, problem)


@dataclass(slots=True)
class BatchPlan:
    """An accepted array: what to hand the server one by one, and how to assemble the answer."""

    forward: list[Message] = field(default_factory=list)
    """Valid messages, in array order, for the server."""
    slots: list[str | Message] = field(default_factory=list)
    """Per answer entry in order: the id key of a request awaiting its response, or a ready error."""
    answers: dict[str, Message] = field(default_factory=dict)

    @property
    def waiting(self) -> list[str]:
        """Id keys of requests not answered yet."""
        return [slot for slot in self.slots if isinstance(slot, str) and slot not in self.answers]

    def answer(self, message: Message) -> None:
        """Record the server's response (or error) to one of this batch's requests."""
        self.answers[id_key(message.get("id"))] = message

    def drop(self, key: str) -> None:
        """Forget a request that will get no response (the client cancelled it)."""
        self.slots = [slot for slot in self.slots if slot != key]

    def responses(self) -> list[Message]:
        """The answer array, in request order; a request left unanswered gets an internal error."""
        out: list[Message] = []
        for slot in self.slots:
            if isinstance(slot, str):
                out.append(
                    self.answers.get(slot)
                    or error_message(json.loads(slot), types.INTERNAL_ERROR, "the server gave no response")
                )
            else:
                out.append(slot)
        return out


def plan_batch(items: list[Any], in_flight: frozenset[str] = frozenset()) -> BatchPlan:
    """Validate each element of an accepted array; `in_flight` are id keys already in use elsewhere."""
    plan = BatchPlan()
    for position, item in enumerate(items):
        try:
            types.jsonrpc_message_adapter.validate_python(item, by_name=False)
        except ValidationError:
            request_id = item.get("id") if isinstance(item, dict) else None
            usable = request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None
            problem = f"element {position} of the batch is not a valid JSON-RPC 2.0 request, notification or response"
            plan.slots.append(error_message(usable, types.INVALID_REQUEST, problem))
            continue
        if "method" in item and "id" in item:
            key = id_key(item["id"])
            if key in plan.slots or key in in_flight:
                problem = f"request id {item['id']!r} is already in use by another request in flight: use unique ids"
                plan.slots.append(error_message(item["id"], types.INVALID_REQUEST, problem))
                continue
            plan.slots.append(key)
        plan.forward.append(item)
    return plan


def line_refusal(line: str) -> Message | None:
    """The error answering a single-message line the SDK cannot read: not JSON (-32700), not a JSON-RPC
    message or nested deeper than its parser goes (-32600, with the id when usable), a request whose
    id is not a string or integer (-32600, id null). None for a valid message or a blank line.

    The SDK's stdio transport drops such lines without a word (and reads a request with a null or
    fractional id as a notification), which leaves a client waiting forever for its response.
    """
    if not line.strip():
        return None
    try:
        # The very parse the SDK does, so exactly the lines it would drop are refused here.
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError:
        return _invalid(line)
    if isinstance(message, types.JSONRPCNotification) and '"id"' in line:
        raw = json.loads(line)
        if "id" in raw:
            problem = f"a request id must be a string or an integer, not {json.dumps(raw['id'])[:40]}"
            return error_message(None, types.INVALID_REQUEST, problem)
    return None


def _invalid(line: str) -> Message:
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than Python's parser goes
        return error_message(None, types.PARSE_ERROR, f"the line is not valid JSON: {err}")
    request_id = message.get("id") if isinstance(message, dict) else None
    usable = request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None
    problem = "the line is not a valid JSON-RPC 2.0 request, notification or response (or is nested too deeply)"
    return error_message(usable, types.INVALID_REQUEST, problem)


def is_response(message: object) -> bool:
    """Whether a decoded message is a JSON-RPC response or error (not a request or notification)."""
    return isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)
