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

import pytest

from tests.e2e.conftest import EVERYTHING, PY, everything_available

pytestmark = pytest.mark.skipif(not everything_available(), reason="server-everything is not installed")
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
