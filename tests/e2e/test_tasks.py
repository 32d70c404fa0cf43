"""Tasks (2025-11-25) relayed through mcpmux, with server-everything's `simulate-research-query`.

No Python or TypeScript SDK client here speaks tasks, so the client is a raw JSON-RPC session on
mcpmux's stdio, the way a task-aware client would speak: a task-augmented `tools/call`, then
`tasks/get`, `tasks/list`, `tasks/result` and `tasks/cancel` with the id mcpmux gave out.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest

from tests.e2e.conftest import EVERYTHING, PY, everything_available, mux_over_http, mux_over_stdio, text_of

pytestmark = [
    pytest.mark.skipif(not everything_available(), reason="server-everything is not installed"),
    pytest.mark.anyio,
]
RESEARCH = "everything__simulate-research-query"


def _research(topic: str, **extra: Any) -> dict[str, Any]:
    return {"name": RESEARCH, "arguments": {"topic": topic}, **extra}


class RawSession:
    """A 2025-11-25 client as JSON-RPC lines on mcpmux's stdio; notifications are set aside."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.next_id = 0
        self.notifications: list[dict[str, Any]] = []

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The response (its `result` or `error` object, whole) to one request."""
        self.next_id += 1
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        while True:
            message = json.loads(self.process.stdout.readline())
            if message.get("id") == self.next_id:
                return message
            self.notifications.append(message)


@contextmanager
def raw_session(tmp_path: Path) -> Iterator[RawSession]:
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "off"\n[servers.everything]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
    )
    command = [PY, "-m", "mcpmux", "serve", "--config", str(config)]
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ),
    )
    try:
        session = RawSession(process)
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        assert session.request("initialize", hello)["result"]["capabilities"]["tasks"] == {
            "cancel": {},
            "list": {},
            "requests": {"tools": {"call": {}}},
        }
        assert process.stdin is not None
        process.stdin.write('{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        session.request("tools/list", {})  # answered once the upstream is connected (mcpmux serves before)
        yield session
    finally:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=15)


def test_a_task_created_through_mcpmux_is_followed_and_answered_under_mcpmux_id(tmp_path: Path) -> None:
    with raw_session(tmp_path) as session:
        created = session.request(
            "tools/call", {"name": RESEARCH, "arguments": {"topic": "bees"}, "task": {"ttl": 60000}}
        )
        task = created["result"]["task"]
        task_id = task["taskId"]
        assert task_id.startswith("everything.")  # mcpmux's id, not the upstream's
        assert task["status"] == "working"
        state = session.request("tasks/get", {"taskId": task_id})["result"]
        assert state["taskId"] == task_id
        assert state["status"] in ("working", "completed")
        assert [t["taskId"] for t in session.request("tasks/list", {})["result"]["tasks"]] == [task_id]
        report = session.request("tasks/result", {"taskId": task_id})["result"]  # held until the task ends
        assert "# Research Report: bees" in report["content"][0]["text"]
        assert report["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
        assert session.request("tasks/get", {"taskId": task_id})["result"]["status"] == "completed"
        # The upstream's status notifications reach the client under mcpmux's id, the last one "completed".
        statuses = [n["params"] for n in session.notifications if n.get("method") == "notifications/tasks/status"]
        assert statuses, "no notifications/tasks/status reached the client"
        assert {status["taskId"] for status in statuses} == {task_id}
        assert statuses[-1]["status"] == "completed"


def test_a_task_can_be_cancelled_and_an_unknown_id_is_not_found(tmp_path: Path) -> None:
    with raw_session(tmp_path) as session:
        created = session.request(
            "tools/call", {"name": RESEARCH, "arguments": {"topic": "ants"}, "task": {"ttl": 60000}}
        )
        task_id = created["result"]["task"]["taskId"]
        assert session.request("tasks/cancel", {"taskId": task_id})["result"]["status"] == "cancelled"
        assert session.request("tasks/get", {"taskId": task_id})["result"]["status"] == "cancelled"
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            missing = session.request(method, {"taskId": "everything.not-a-task"})["error"]
            assert missing == {"code": -32602, "message": "Task not found: everything.not-a-task"}
        # Without a task, the same tool still answers: mcpmux runs the task itself and waits for it.
        plain = session.request("tools/call", _research("wasps"))["result"]
        assert "# Research Report: wasps" in plain["content"][0]["text"]
        assert "_meta" not in plain or "io.modelcontextprotocol/related-task" not in plain["_meta"]


def _messages(response: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a response, JSON or an event stream."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


async def test_a_tasks_status_reaches_its_http_session_on_its_stream(tmp_path: Path) -> None:
    """Over HTTP, a 2025 session's task status notifications arrive on that session's GET stream."""
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "off"\n[servers.everything]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
    )
    accept = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
    streamed: list[dict[str, Any]] = []
    with mux_over_http(config) as url:
        async with httpx2.AsyncClient(timeout=30) as http:

            async def post(message: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
                response = await http.post(url, json={"jsonrpc": "2.0", **message}, headers=headers)
                response.raise_for_status()
                return _messages(response) if response.status_code != 202 else []

            hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
            response = await http.post(
                url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=accept
            )
            headers = {**accept, "mcp-session-id": response.headers["mcp-session-id"]}
            await post({"method": "notifications/initialized"}, headers)

            async def listen() -> None:
                async with http.stream("GET", url, headers={**headers, "accept": "text/event-stream"}) as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("data:"):
                            streamed.append(json.loads(line[5:]))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(listen)
                await anyio.sleep(0.5)  # the stream is open before the task starts
                call = {"id": 2, "method": "tools/call", "params": {**_research("moths"), "task": {"ttl": 60000}}}
                task_id = (await post(call, headers))[-1]["result"]["task"]["taskId"]
                await post({"id": 3, "method": "tasks/result", "params": {"taskId": task_id}}, headers)
                with anyio.fail_after(10):
                    while not any(m.get("params", {}).get("status") == "completed" for m in streamed):
                        await anyio.sleep(0.1)
                tasks.cancel_scope.cancel()
    statuses = [m["params"] for m in streamed if m.get("method") == "notifications/tasks/status"]
    assert {status["taskId"] for status in statuses} == {task_id}
    assert task_id.startswith("everything.")


async def test_an_upstream_asks_for_sampling_as_a_task_and_the_calling_client_answers(tmp_path: Path) -> None:
    """server-everything's `-async` tools: mcpmux takes the upstream's sampling request as a task of its own,
    the client whose call caused it answers it, and the upstream polls the task to its result."""
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "off"\n[servers.everything]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
    )
    asked: list[str] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)  # type: ignore[union-attr]
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled by the client"), model="client-llm"
        )

    async with mux_over_stdio(config, mode="legacy", sampling_callback=sample) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"everything__trigger-sampling-request-async", "everything__trigger-elicitation-request-async"} <= names
        result = await client.call_tool("everything__trigger-sampling-request-async", {"prompt": "a haiku"})
    text = text_of(result)
    assert not result.is_error, text
    assert text.startswith("[COMPLETED] Async sampling completed!"), text
    assert "Task created: mcpmux-" in text  # the upstream polled mcpmux's task
    assert "sampled by the client" in text
    assert asked == ["Resource trigger-sampling-request-async context: a haiku"]


async def test_an_elicitation_task_for_a_client_that_cannot_answer_is_declined(tmp_path: Path) -> None:
    """A client that declared no elicitation gets the documented fallback in a task too: declined."""
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        f'[inference]\nbackend = "off"\n[servers.everything]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
    )
    async with mux_over_stdio(config, mode="legacy") as client:
        result = await client.call_tool("everything__trigger-elicitation-request-async", {})
    text = text_of(result)
    assert text.startswith("[DECLINED] User declined to provide the requested information."), text
    assert "Task created: mcpmux-" in text
