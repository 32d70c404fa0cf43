"""The tasks an upstream asks mcpmux to run: each request about them answered once, with the right outcome."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from mcpmux.upstream.task_receiver import CAPABILITY, ClientTasks, TaskFailed, declare

pytestmark = pytest.mark.anyio

SAMPLE = {"messages": [], "maxTokens": 5, "task": {"ttl": 60000}}


class Upstream:
    """What the upstream reads back: every message written, and one answer function's gate."""

    def __init__(self) -> None:
        self.read: list[dict[str, Any]] = []
        self.release = anyio.Event()

    async def write(self, message: dict[str, Any]) -> None:
        self.read.append(message)

    def answer_to(self, request_id: int) -> dict[str, Any]:
        (answer,) = [m for m in self.read if m.get("id") == request_id]
        return answer


async def test_a_task_is_created_at_once_polled_and_answered_with_its_result() -> None:
    upstream = Upstream()

    async def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert "task" not in params  # the work is the request without its task
        await upstream.release.wait()
        return {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}

    async with anyio.create_task_group() as group:
        tasks = ClientTasks(answer, upstream.write, group)
        assert await tasks.take({"id": 1, "method": "sampling/createMessage", "params": SAMPLE})
        task_id = upstream.answer_to(1)["result"]["task"]["taskId"]
        assert await tasks.take({"id": 2, "method": "tasks/get", "params": {"taskId": task_id}})
        assert upstream.answer_to(2)["result"]["status"] == "working"
        assert await tasks.take({"id": 3, "method": "tasks/result", "params": {"taskId": task_id}})
        await anyio.sleep(0.05)
        assert not [m for m in upstream.read if m.get("id") == 3]  # held until the task ends
        upstream.release.set()
        with anyio.fail_after(5):
            while not [m for m in upstream.read if m.get("id") == 3]:
                await anyio.sleep(0.01)
    result = upstream.answer_to(3)["result"]
    assert result["content"]["text"] == "hi"
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    (status,) = [m for m in upstream.read if m.get("method") == "notifications/tasks/status"]
    assert status["params"]["status"] == "completed"


async def test_cancelled_failed_and_unknown_tasks() -> None:
    upstream = Upstream()

    async def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "elicitation/create":
            raise TaskFailed({"code": -1, "message": "the client refused"})
        await anyio.sleep_forever()
        raise AssertionError

    async with anyio.create_task_group() as group:
        tasks = ClientTasks(answer, upstream.write, group)
        await tasks.take({"id": 1, "method": "sampling/createMessage", "params": SAMPLE})
        waiting = upstream.answer_to(1)["result"]["task"]["taskId"]
        await tasks.take({"id": 2, "method": "elicitation/create", "params": {"message": "?", "task": {}}})
        failing = upstream.answer_to(2)["result"]["task"]["taskId"]
        await anyio.sleep(0.05)
        await tasks.take({"id": 3, "method": "tasks/list", "params": {}})
        listed = {t["taskId"]: t["status"] for t in upstream.answer_to(3)["result"]["tasks"]}
        assert listed == {waiting: "working", failing: "failed"}
        await tasks.take({"id": 4, "method": "tasks/cancel", "params": {"taskId": waiting}})
        assert upstream.answer_to(4)["result"]["status"] == "cancelled"
        await tasks.take({"id": 5, "method": "tasks/cancel", "params": {"taskId": waiting}})
        assert upstream.answer_to(5)["error"]["message"] == f"Task {waiting} already cancelled"
        await tasks.take({"id": 6, "method": "tasks/result", "params": {"taskId": failing}})
        await tasks.take({"id": 7, "method": "tasks/get", "params": {"taskId": "nope"}})
        # Not a task request of this module's, or a result for a task it never gave out: the session's.
        assert not await tasks.take({"id": 8, "method": "sampling/createMessage", "params": {"messages": []}})
        assert not await tasks.take({"id": 9, "method": "tasks/result", "params": {"taskId": "nope"}})
        await anyio.sleep(0.05)
    assert upstream.answer_to(6)["error"] == {"code": -1, "message": "the client refused"}
    assert upstream.answer_to(7)["error"] == {"code": -32602, "message": "Task not found: nope"}


def test_the_capability_is_declared_only_where_tasks_exist() -> None:
    hello = {"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}}
    declared = declare({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
    assert declared["params"]["capabilities"] == {"sampling": {}, "tasks": CAPABILITY}
    older = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {**hello, "protocolVersion": "2025-06-18"}}
    assert declare(older) == older
