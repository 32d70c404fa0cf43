"""JSON-RPC batch arrays on stdio: a line filter between the process's stdin/stdout and the SDK.

The SDK's stdio transport reads one JSON-RPC message per line and drops anything else, arrays
included. `StdioClientWire` hands it the lines instead: a line holding an array from a client that
negotiated 2025-03-26 is split into one line per message, and the responses to those requests are
held back as the server writes them and written as one array line once every request is answered.
Every other line passes through untouched. The negotiated version is read off the `initialize`
response as it goes out.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, cast

import anyio
import mcp_types as types

from mcpmux.wire.batch_array import (
    BatchPlan,
    array_refusal,
    error_message,
    id_key,
    is_response,
    line_refusal,
    plan_batch,
)
from mcpmux.wire.stdio_lines import LineWriter, read_lines

logger = logging.getLogger(__name__)


@contextmanager
def claimed_stdio() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """The wire ends of stdin and stdout, private to the caller while it serves.

    Meanwhile fd 0 reads /dev/null and fd 1 writes to stderr, so a stray `print()` or a child that
    inherits the descriptors cannot corrupt the protocol stream. Both are restored on exit; the
    private duplicates stay open because a worker thread may still be blocked reading them.
    """
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    try:
        yield os.fdopen(wire_in, "rb", closefd=False), os.fdopen(wire_out, "wb", closefd=False)
    finally:
        for wire, fd in ((wire_in, 0), (wire_out, 1)):
            os.set_blocking(wire, True)  # the wire may have been served non-blocking (mcpmux.wire.stdio_lines)
            os.dup2(wire, fd)


class StdioClientWire:
    """Splits inbound batch arrays and joins their responses; give `stdin`/`stdout` to `stdio_server`."""

    def __init__(self, wire_in: BinaryIO, wire_out: BinaryIO) -> None:
        self._in = wire_in
        self._out = LineWriter(wire_out)
        self.protocol_version: str | None = None
        """The revision the server negotiated with this client (None before initialize)."""
        self._initialize_ids: set[str] = set()
        self._pending: dict[str, BatchPlan] = {}
        self.take: Callable[[str], bool] | None = None
        """A hook that may answer a client line itself (the fast path), called as the line is read;
        True keeps it from the SDK."""

    @property
    def stdin(self) -> anyio.AsyncFile[str]:
        """What `stdio_server(stdin=...)` reads: the client's lines, arrays split up."""
        # stdio_server only iterates its stdin line by line, which an async generator does too.
        return cast("anyio.AsyncFile[str]", self._lines())

    @property
    def stdout(self) -> anyio.AsyncFile[str]:
        """What `stdio_server(stdout=...)` writes to: the server's lines, batch responses joined."""
        # stdio_server only calls write() and flush() on its stdout.
        return cast("anyio.AsyncFile[str]", _Writer(self))

    def _offer(self, line: str) -> bool:
        """The fast path's chance at a line (not an array), the moment it is read."""
        return self.take is not None and not line.lstrip().startswith("[") and self.take(line)

    async def _lines(self) -> AsyncIterator[str]:
        # The fast path takes only well-formed messages, so its lines skip the SDK's parse below.
        async for line in read_lines(self._in, offer=self._offer):
            if line.lstrip().startswith("["):
                for message in await self._split(line):
                    yield json.dumps(message) + "\n"
                continue
            refusal = line_refusal(line)
            if refusal is not None:
                await self._write(refusal)  # the SDK would drop the line and leave its sender waiting
                continue
            await self._observe(line)
            yield line

    async def _observe(self, line: str) -> None:
        """Remember initialize ids (to learn the version) and cancellations of batched requests."""
        if '"initialize"' not in line and "notifications/cancelled" not in line:
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return  # line_refusal has answered it already
        if not isinstance(message, dict):
            return
        if message.get("method") == "initialize" and "id" in message:
            self._initialize_ids.add(id_key(message["id"]))
        elif message.get("method") == "notifications/cancelled":
            key = id_key((message.get("params") or {}).get("requestId"))
            plan = self._pending.pop(key, None)
            if plan is not None:
                plan.drop(key)  # a cancelled request gets no response; the rest of its batch still does
                if not plan.waiting:
                    await self._finish(plan)

    async def _split(self, line: str) -> list[dict[str, Any]]:
        """The messages of an array line to feed the server; refusals are answered right here."""
        try:
            items = json.loads(line)
        except (ValueError, RecursionError) as err:
            await self._write(error_message(None, types.PARSE_ERROR, f"the line is not valid JSON: {err}"))
            return []
        refusal = array_refusal(items, self.protocol_version)
        if refusal is not None:
            await self._write(refusal)
            return []
        plan = plan_batch(items, frozenset(self._pending))
        for key in plan.waiting:
            self._pending[key] = plan
        for message in plan.forward:
            await self._observe(json.dumps(message))
        if not plan.waiting:
            await self._finish(plan)
        return plan.forward

    async def _emit(self, text: str) -> None:
        """A line the server wrote: hold it if it answers a batched request, else write it."""
        if self._pending or self._initialize_ids:
            message = json.loads(text)
            if is_response(message):
                key = id_key(message.get("id"))
                if key in self._initialize_ids:
                    self._initialize_ids.discard(key)
                    self.protocol_version = (message.get("result") or {}).get("protocolVersion")
                plan = self._pending.pop(key, None)
                if plan is not None:
                    plan.answer(message)
                    if not plan.waiting:
                        await self._finish(plan)
                    return
        await self._write_text(text)

    async def _finish(self, plan: BatchPlan) -> None:
        responses = plan.responses()
        if responses:  # an array of notifications only gets no answer at all
            await self._write(responses)

    async def _write(self, payload: object) -> None:
        await self._write_text(json.dumps(payload, separators=(",", ":")) + "\n")

    async def write_line(self, text: str | bytes) -> None:
        """Write one line (ending in a newline) to the client, between the SDK's own lines."""
        await self._write_text(text)

    def write_line_now(self, text: str | bytes) -> bool:
        """`write_line` from synchronous code, when the wire takes the line at once; False when nothing was written."""
        return self._out.write_now(text)

    async def _write_text(self, text: str | bytes) -> None:
        await self._out.write(text)


class _Writer:
    """The write side handed to the SDK; every line goes through `StdioClientWire._emit`."""

    def __init__(self, edge: StdioClientWire) -> None:
        self._edge = edge

    async def write(self, text: str) -> None:
        await self._edge._emit(text)

    async def flush(self) -> None:
        """Lines are flushed as they are written."""
