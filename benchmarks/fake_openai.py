"""A canned OpenAI-compatible streaming server, so that what a relay costs can be measured without vLLM.

    python benchmarks/fake_openai.py PORT [--delay-ms 5]

`/v1/models`, and `/v1/chat/completions` / `/v1/completions`, streamed (SSE, `stream_options`
`include_usage` honoured) or whole: `max_tokens` chunks of one word each, `--delay-ms` apart, the
words picked from the prompt's hash, so that the same prompt always gets the same answer and two
prompts different ones. A `response_format` or `tools` is refused with HTTP 400, as a server without
structured output would. Written on asyncio streams with HTTP/1.1 keep-alive and chunked bodies (as
vLLM's uvicorn answers) and nothing else, so that its own CPU per request is a small fraction of
the relay's it is there to measure.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from typing import Any

WORDS = ("the", "sea", "light", "fox", "ran", "over", "a", "quiet", "hill", "and", "rain", "fell", "on", "old", "roofs")


def answer_words(body: dict[str, Any]) -> list[str]:
    """The canned answer: `max_tokens` words, the same for the same prompt."""
    prompt = json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True).encode()
    seed = hashlib.sha256(prompt).digest()
    count = int(body.get("max_tokens") or 16)
    return [(" " if i else "") + WORDS[(seed[i % 32] + i) % len(WORDS)] for i in range(count)]


def chunk(body: dict[str, Any], ident: str, text: str | None, finish: str | None = None) -> bytes:
    """One SSE event: a chat chunk (`delta`) or a text completion chunk (`text`)."""
    if "messages" in body:
        delta = {"content": text} if text is not None else {}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        kind = "text_completion"
    event = {"id": ident, "object": kind, "created": int(time.time()), "model": body.get("model"), "choices": [choice]}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def usage(body: dict[str, Any], completion: int) -> dict[str, int]:
    prompt = len(json.dumps(body.get("messages") or body.get("prompt")).split())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class FakeServer:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.served = 0

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
                length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
                raw = await reader.readexactly(length) if length else b""
                await self.respond(method, path, json.loads(raw) if raw else {}, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def respond(self, method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        if method == "GET" and path.endswith("/models"):
            data = {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]}
            return self.whole(writer, 200, data)
        if not path.endswith("/completions"):
            return self.whole(writer, 404, {"error": {"message": f"no route {path}", "type": "not_found"}})
        if body.get("response_format") or body.get("tools"):
            return self.whole(writer, 400, {"error": {"message": "structured output is not served here"}})
        self.served += 1
        ident = f"fake-{self.served}"
        words = answer_words(body)
        if not body.get("stream"):
            return self.whole(writer, 200, self.completion(body, ident, words))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        if "messages" in body:
            self.part(writer, chunk(body, ident, ""))  # vLLM's first chat chunk: the role, no text
        for word in words:
            await asyncio.sleep(self.delay)
            self.part(writer, chunk(body, ident, word))
            await writer.drain()
        self.part(writer, chunk(body, ident, None, "length"))
        if (body.get("stream_options") or {}).get("include_usage"):
            event = {"id": ident, "object": "chat.completion.chunk", "model": body.get("model"), "choices": []}
            event["usage"] = usage(body, len(words))
            self.part(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
        self.part(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    @staticmethod
    def completion(body: dict[str, Any], ident: str, words: list[str]) -> dict[str, Any]:
        text = "".join(words)
        if "messages" in body:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice["finish_reason"] = "length"
        return {"id": ident, "object": "completion", "model": body.get("model"), "choices": [choice],
                "usage": usage(body, len(words))}  # fmt: skip

    @staticmethod
    def part(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))

    @staticmethod
    def whole(writer: asyncio.StreamWriter, status: int, data: dict[str, Any]) -> None:
        payload = json.dumps(data).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )


async def serve(port: int, delay: float) -> None:
    server = await asyncio.start_server(FakeServer(delay).connection, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("port", type=int)
    ap.add_argument("--delay-ms", type=float, default=5.0, help="time between two streamed chunks")
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
