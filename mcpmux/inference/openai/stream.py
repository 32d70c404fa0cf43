"""Streamed (SSE) OpenAI responses and the pieces streamed and whole responses share.

`GenerationStream` runs the choices of a request (`n` > 1) concurrently in its own task group (so they
share engine steps; a single choice is read in the response's own task, with no hand-over per
delta), relays their deltas as `chat.completion.chunk` / `text_completion` events and ends
with `data: [DONE]`. An error before the first delta becomes an ordinary HTTP error response (so a
full queue is a 503, not a 200 stream); a later one is sent as an `error` event before `[DONE]`.
A client that disconnects cancels the task group, which aborts its requests in the engine.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import ObjectSendStream
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.engine.outputs import TokenLogprob
from mcpmux.inference.openai.requests import GenerationRequest, Prompt
from mcpmux.inference.serving.delta import Delta
from mcpmux.inference.serving.service import InferenceService
from mcpmux.inference.serving.tool_calls import CallStream, ToolCall

Event = tuple[int, Delta | Exception]


@dataclass(slots=True)
class ChoiceResult:
    """A finished choice's token counts, for `usage`."""

    index: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def usage_of(finished: list[ChoiceResult], n: int) -> dict[str, Any]:
    """OpenAI `usage`: each prompt counted once (its first choice), completions summed over all choices."""
    firsts = [c for c in finished if c.index % n == 0]
    prompt = sum(c.prompt_tokens for c in firsts)
    completion = sum(c.completion_tokens for c in finished)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in firsts)},
    }


def tool_call_json(call: ToolCall) -> dict[str, Any]:
    """A call in OpenAI's `tool_calls` shape (`arguments` as the JSON text the model wrote)."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}


def choice_logprobs(
    service: InferenceService, model: str, chat: bool, logprobs: list[TokenLogprob] | None
) -> dict[str, Any] | None:
    """Logprobs in the chat (`content: [...]`) or legacy completions (`tokens`, `token_logprobs`) shape."""
    if logprobs is None:
        return None

    def text(token_id: int) -> str:
        return service.token_text(model, token_id)

    if chat:
        content = [
            {
                "token": text(lp.token_id),
                "logprob": lp.logprob,
                "bytes": list(text(lp.token_id).encode()),
                "top_logprobs": [{"token": text(t), "logprob": p, "bytes": list(text(t).encode())} for t, p in lp.top],
            }
            for lp in logprobs
        ]
        return {"content": content}
    tokens = [text(lp.token_id) for lp in logprobs]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{text(t): p for t, p in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }


class GenerationStream(Response):
    """The SSE response of a `stream: true` chat or text completion request."""

    def __init__(
        self,
        service: InferenceService,
        req: GenerationRequest,
        model: str,
        on_error: Callable[[BaseException], Response],
    ) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.service, self.req, self.model, self.on_error = service, req, model, on_error
        self.id = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.choices = req.choices()
        tools = req.tools if req.tools is not None and req.tools.may_call else None
        self.calls = {index: CallStream(tools) for index, _, _ in self.choices} if tools is not None else {}
        self._out: list[bytes] = []  # events not yet written
        self._around: dict[int, tuple[bytes, bytes]] = {}  # by choice: a text event's bytes before and after the text
        self._ended = False  # the response's last message is sent (or being sent)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._cancel_on_disconnect, receive, tg.cancel_scope)
            if len(self.choices) == 1:  # read in this very task: no hand-over from task to task per delta
                async with aclosing(self._events(*self.choices[0])) as events:
                    await self._relay(events, scope, receive, send)
            else:
                sender, received = anyio.create_memory_object_stream[Event](math.inf)
                async with sender:
                    for index, prompt, params in self.choices:
                        tg.start_soon(self._produce, index, prompt, params, sender.clone())
                async with received:
                    await self._relay(received, scope, receive, send)
                tg.cancel_scope.cancel()  # an error event ends the response while other choices still run
            if not self._ended:
                tg.cancel_scope.cancel()
            # Else the response is complete and the disconnect watcher returns by itself: cancelling it cost
            # ~0.1 ms a request here (anyio delivers the cancellation, and formats the cancelling task's repr).

    async def _events(self, index: int, prompt: Prompt, params: SamplingParams) -> AsyncGenerator[Event, None]:
        """One choice's deltas, or the error that ended them, as events."""
        try:
            req = self.req
            async for delta in self.service.stream(
                prompt, params, model=self.model, priority=req.priority, tools=req.tools
            ):
                yield index, delta
        except Exception as exc:  # relayed to the client as an error response or event
            yield index, exc

    async def _produce(self, index: int, prompt: Prompt, params: SamplingParams, out: ObjectSendStream[Event]) -> None:
        async with out, aclosing(self._events(index, prompt, params)) as events:
            async for event in events:
                await out.send(event)

    async def _cancel_on_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        """Cancel the response if the client leaves before its end (once it ends, `receive` says disconnect too)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._ended:
            scope.cancel()

    async def _relay(self, events: AsyncIterator[Event], scope: Scope, receive: Receive, send: Send) -> None:
        """Each delta's events go out in one write; a request's last ones go with its `usage` and `[DONE]`."""
        started = False
        finished: list[ChoiceResult] = []
        async for index, item in events:
            if isinstance(item, Exception):
                if not started:
                    self._ended = True
                    await self.on_error(item)(scope, receive, send)
                    return
                error = self.on_error(item)
                self._event(json.loads(bytes(error.body)))
                break
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                self._begin()
            self._deltas(index, item)
            if item.finish_reason is not None:
                finished.append(
                    ChoiceResult(index, item.prompt_tokens, item.cached_prompt_tokens, item.completion_tokens)
                )
                if len(finished) == len(self.choices):
                    continue  # the end of the response follows at once
            await send({"type": "http.response.body", "body": self._take(), "more_body": True})
        if self.req.include_usage:
            self._event(self._chunk([], usage=usage_of(finished, self.req.n)))
        self._ended = True
        await send({"type": "http.response.body", "body": self._take() + b"data: [DONE]\n\n", "more_body": False})

    def _begin(self) -> None:
        if self.req.chat:
            roles = [self._choice(i, {"role": "assistant", "content": ""}) for i, _, _ in self.choices]
            self._event(self._chunk(roles))

    def _deltas(self, index: int, delta: Delta) -> None:
        calls = self.calls.get(index)
        if calls is not None and calls.sees_call(delta.text):
            self._call_deltas(index, delta, calls)
            return
        if delta.text and self.req.top_logprobs is None:
            self._out.append(self._text_event(index, delta.text))
        elif delta.text or delta.logprobs:
            logprobs = (
                choice_logprobs(self.service, self.model, self.req.chat, delta.logprobs)
                if self.req.top_logprobs is not None
                else None
            )
            self._event(self._chunk([self._choice(index, {"content": delta.text}, delta.text, logprobs)]))
        if delta.finish_reason is not None:
            finish = "stop" if delta.finish_reason == "abort" else delta.finish_reason
            self._event(self._chunk([self._choice(index, {}, "", None, finish)]))

    def _call_deltas(self, index: int, delta: Delta, calls: CallStream) -> None:
        """A call's deltas: its id and name once known, then argument fragments; `tool_calls` at its end."""
        named = calls.name is not None
        fragment = calls.feed(delta.text, final=delta.finish_reason is not None)
        if calls.name is not None and not named:
            function = {"name": calls.name, "arguments": ""}
            head = {"index": 0, "id": calls.call_id, "type": "function", "function": function}
            self._event(self._chunk([self._choice(index, {"tool_calls": [head]})]))
        if fragment:
            piece = {"index": 0, "function": {"arguments": fragment}}
            self._event(self._chunk([self._choice(index, {"tool_calls": [piece]})]))
        if delta.finish_reason is not None:
            finish = "stop" if delta.finish_reason == "abort" else delta.finish_reason
            finish = "tool_calls" if calls.use.parse(calls.text) is not None else finish
            self._event(self._chunk([self._choice(index, {}, "", None, finish)]))

    def _choice(
        self,
        index: int,
        delta: dict[str, Any],
        text: str = "",
        logprobs: dict[str, Any] | None = None,
        finish: str | None = None,
    ) -> dict[str, Any]:
        if self.req.chat:
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.req.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return chunk

    def _text_event(self, index: int, text: str) -> bytes:
        """The event of a choice's new text: its chunk's bytes around the text's JSON (most of a stream's events)."""
        around = self._around.get(index)
        if around is None:
            event = self._encode(self._chunk([self._choice(index, {"content": _MARK}, _MARK)]))
            before, _, after = event.rpartition(_MARK_JSON)  # past the id and model: nothing of theirs is matched
            around = self._around[index] = (before, after)
        return around[0] + json.dumps(text).encode() + around[1]

    def _event(self, payload: dict[str, Any]) -> None:
        """Add an event to what the next write sends."""
        self._out.append(self._encode(payload))

    @staticmethod
    def _encode(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def _take(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)


# A text event is its chunk serialised once around this string, then its text in its place.
_MARK = "\0text\0"
_MARK_JSON = json.dumps(_MARK).encode()

# Set by hand: Response.__init__ would declare a Content-Length for its (empty) body.
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
