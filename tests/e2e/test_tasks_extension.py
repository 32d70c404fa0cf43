"""Tasks for 2026-07-28 clients (the `io.modelcontextprotocol/tasks` extension) through mcpmux.

The client is `mcp.Client` declaring the extension (`tests/e2e/task_client.py`), over mcpmux's stdio
and HTTP fronts. Upstreams, each over stdio and HTTP: server-everything (npm, 2025-11-25), whose
`simulate-research-query` runs only as a task, and `tests/servers/task_server.py`, an SDK 2.3 server
that answers with tasks (2026-07-28). Each cell with the 2026 server compares what the client sees
through mcpmux with what it sees connected directly; server-everything speaks no 2026, so its
report is compared with the one a 2025 task-aware client gets from it directly.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import (
    EVERYTHING,
    PY,
    ROOT,
    STARTUP_WAIT,
    everything_available,
    free_port,
    mux_over_http,
    mux_over_stdio,
    stop,
    text_of,
    wait_for_port,
)
from tests.e2e.task_client import (
    EXTENSION,
    CreateTaskResult,
    TasksExtension,
    ask,
    cancel_task,
    get_task,
    update_task,
    wait_for,
)

pytestmark = pytest.mark.anyio
TASK_SERVER = ROOT / "tests" / "servers" / "task_server.py"
TOKENS = ("tasks-test-token-one-0123456789abcdef", "tasks-test-token-two-0123456789abcdef")
RESEARCH = "everything__simulate-research-query"
needs_everything = pytest.mark.skipif(not everything_available(), reason="server-everything is not installed")


def _config(tmp_path: Path, servers: dict[str, dict[str, Any]]) -> Path:
    """mcpmux's config: `servers`, two accepted bearer tokens, no local model."""
    (tmp_path / "tokens").write_text("\n".join(TOKENS) + "\n")
    config = tmp_path / "mcp.json"
    raw = {
        "mcpServers": servers,
        "http": {"auth_token_file": "tokens"},
        "inference": {"backend": "off"},
        "mux": {"startup_list_wait": STARTUP_WAIT},  # the first list is where a test knows its upstreams are up
    }
    config.write_text(json.dumps(raw))
    return config


@asynccontextmanager
async def _http_client(url: str, token: str, *, tasks: bool = True, **options: Any) -> AsyncIterator[Client]:
    extensions = [TasksExtension()] if tasks else None
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=None)) as http,
        Client(streamable_http_client(url, http_client=http), extensions=extensions, **options) as connected,
    ):
        yield connected


@asynccontextmanager
async def _through(front: str, config: Path, *, tasks: bool = True, **options: Any) -> AsyncIterator[Client]:
    """A 2026 client of mcpmux on `front` (stdio, or HTTP with the first token); `options` are `Client`'s."""
    extensions = [TasksExtension()] if tasks else None
    if front == "stdio":
        async with mux_over_stdio(config, extensions=extensions, **options) as client:
            yield client
    else:
        with mux_over_http(config) as url:
            async with _http_client(url, TOKENS[0], tasks=tasks, **options) as client:
                yield client


async def _error(request: Any) -> tuple[int, Any]:
    with pytest.raises(MCPError) as raised:
        await request
    return raised.value.error.code, raised.value.error.data


# -- a 2025-11-25 upstream: server-everything ------------------------------------------------------


@contextmanager
def _everything(upstream: str) -> Iterator[dict[str, Any]]:
    """server-everything's entry in mcpmux's config: a child on stdio, or a server on loopback HTTP."""
    if upstream == "stdio":
        yield {"command": "node", "args": [str(EVERYTHING), "stdio"]}
        return
    port = free_port()
    env = {**os.environ, "PORT": str(port)}
    process = subprocess.Popen(["node", str(EVERYTHING), "streamableHttp"], env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield {"url": f"http://127.0.0.1:{port}/mcp"}
    finally:
        stop(process)


def _report_directly(topic: str, clarified: str | None = None) -> str:
    """server-everything's report on `topic`, for a 2025 client that runs the tool as a task itself;
    with `clarified`, an ambiguous query, and the client answers the elicitation for it so."""
    process = subprocess.Popen(
        ["node", str(EVERYTHING), "stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None
    assert process.stdout is not None
    replies: dict[int, dict[str, Any]] = {}

    def request(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + "\n")
        process.stdin.flush()
        while request_id not in replies:
            message = json.loads(process.stdout.readline())
            if "id" in message and "method" not in message:
                replies[message["id"]] = message
            elif message.get("method") == "elicitation/create":
                answer = {"action": "accept", "content": {"interpretation": clarified}}
                process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": answer}) + "\n")
                process.stdin.flush()
        return replies[request_id]

    try:
        capabilities = {"elicitation": {}} if clarified else {}
        hello = {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "d", "version": "1"},
        }
        request(1, "initialize", hello)
        process.stdin.write('{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        arguments = {"topic": topic, "ambiguous": clarified is not None}
        call = {"name": "simulate-research-query", "arguments": arguments, "task": {"ttl": 60000}}
        task_id = request(2, "tools/call", call)["result"]["task"]["taskId"]
        report = request(3, "tasks/result", {"taskId": task_id})["result"]
        return str(report["content"][0]["text"])
    finally:
        process.terminate()  # its timers keep it running after stdin closes
        process.wait(timeout=15)


@needs_everything
@pytest.mark.parametrize(("front", "upstream"), [("stdio", "stdio"), ("http", "http")])
async def test_a_2025_upstreams_task_is_a_2026_clients_task_under_mcpmux_id(
    tmp_path: Path, front: str, upstream: str
) -> None:
    with _everything(upstream) as entry:
        await _a_2025_task(tmp_path, front, entry)


async def _a_2025_task(tmp_path: Path, front: str, entry: dict[str, Any]) -> None:
    config = _config(tmp_path, {"everything": entry})
    reports: list[str] = []

    async def report_directly() -> None:
        reports.append(await anyio.to_thread.run_sync(_report_directly, "bees"))

    async with anyio.create_task_group() as meanwhile, _through(front, config) as client:
        meanwhile.start_soon(report_directly)
        assert client.server_capabilities.extensions == {EXTENSION: {}}
        created = await client.session.call_tool(RESEARCH, {"topic": "bees"}, allow_claimed=True)
        assert isinstance(created, CreateTaskResult)
        task_id = created.task_id
        assert task_id.startswith("everything.")  # mcpmux's id, namespaced per upstream
        assert (created.status, created.ttl_ms, created.poll_interval_ms) == ("working", 300000, 1000)
        state = await get_task(client.session, task_id)
        assert state["resultType"] == "complete"
        assert state["taskId"] == task_id
        assert state["status"] == "working"
        # A second task, resolved as a task-aware host does it (polling to its end), meanwhile.
        async with anyio.create_task_group() as both:
            resolved: list[str] = []

            async def resolve() -> None:
                resolved.append(text_of(await client.call_tool(RESEARCH, {"topic": "bees"})))

            both.start_soon(resolve)
            done = await wait_for(client.session, task_id)
        with anyio.fail_after(30):
            while not reports:
                await anyio.sleep(0.1)
        direct = reports[0]
        assert done["status"] == "completed"
        assert done["result"]["content"][0]["text"] == direct
        assert "io.modelcontextprotocol/related-task" not in done["result"].get("_meta", {})  # a 2025 word
        assert resolved == [direct]
        assert await get_task(client.session, task_id) == done  # an ended task reads the same ever after

        cancelled = await client.session.call_tool(RESEARCH, {"topic": "ants"}, allow_claimed=True)
        assert isinstance(cancelled, CreateTaskResult)
        ack = await cancel_task(client.session, cancelled.task_id)
        assert {key: value for key, value in ack.items() if key != "_meta"} == {"resultType": "complete"}
        assert (await wait_for(client.session, cancelled.task_id))["status"] == "cancelled"

        for request in (
            get_task(client.session, "everything.not-a-task"),
            cancel_task(client.session, "everything.not-a-task"),
            update_task(client.session, "everything.not-a-task", {}),
        ):
            assert await _error(request) == (-32602, None)
        # The extension has no tasks/result (tasks/get carries the result) and no tasks/list.
        assert await _error(ask(client.session, "tasks/result", task_id)) == (-32601, "tasks/result")
        assert await _error(ask(client.session, "tasks/list", task_id)) == (-32601, "tasks/list")


@needs_everything
@pytest.mark.parametrize(("front", "upstream"), [("stdio", "http"), ("http", "stdio")])
async def test_a_2025_upstreams_question_during_a_task_is_the_tasks_input_request(
    tmp_path: Path, front: str, upstream: str
) -> None:
    """server-everything asks for a clarification while an ambiguous research runs: mcpmux shows the
    2026 client the question in `tasks/get` (`input_required`), and its `tasks/update` answers it."""
    with _everything(upstream) as entry:
        await _a_question(tmp_path, front, entry)


async def _a_question(tmp_path: Path, front: str, entry: dict[str, Any]) -> None:
    config = _config(tmp_path, {"everything": entry})
    reports: list[str] = []

    async def report_directly() -> None:
        reports.append(await anyio.to_thread.run_sync(_report_directly, "python", "snake"))

    async def elicit(context: Any, params: Any) -> Any:
        raise AssertionError("a 2026 client is asked in the task's inputRequests, never pushed a request")

    async with anyio.create_task_group() as meanwhile:
        meanwhile.start_soon(report_directly)
        async with _through(front, config, elicitation_callback=elicit) as client:
            created = await client.session.call_tool(
                RESEARCH, {"topic": "python", "ambiguous": True}, allow_claimed=True
            )
            assert isinstance(created, CreateTaskResult)
            asking = await wait_for(client.session, created.task_id, until=("input_required",))
            ((key, question),) = asking["inputRequests"].items()
            assert question["method"] == "elicitation/create"
            assert question["params"]["message"].startswith('The research query "python" could have multiple')
            assert "_meta" not in question["params"]  # its related-task names the upstream's task
            choices = question["params"]["requestedSchema"]["properties"]["interpretation"]["oneOf"]
            assert {"const": "snake", "title": "Python snake species"} in choices
            answer = {key: {"action": "accept", "content": {"interpretation": "snake"}}}
            assert (await update_task(client.session, created.task_id, answer))["resultType"] == "complete"
            done = await wait_for(client.session, created.task_id)
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == reports[0]
    assert "# Research Report: python (snake)" in reports[0]


@needs_everything
async def test_a_task_is_its_owners_alone_and_a_client_without_the_extension_is_answered_plainly(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, {"everything": {"command": "node", "args": [str(EVERYTHING), "stdio"]}})
    with mux_over_http(config) as url:
        async with (
            _http_client(url, TOKENS[0]) as owner,
            _http_client(url, TOKENS[1]) as stranger,
            _http_client(url, TOKENS[0], tasks=False) as plain,
        ):
            created = await owner.session.call_tool(RESEARCH, {"topic": "owls"}, allow_claimed=True)
            assert isinstance(created, CreateTaskResult)
            # The owner declared no elicitation: the upstream's question is declined, no other client asked.
            unasked = await owner.session.call_tool(
                RESEARCH, {"topic": "python", "ambiguous": True}, allow_claimed=True
            )
            assert isinstance(unasked, CreateTaskResult)
            # Another client (another token) is told what an id that never existed gets: not found.
            for request in (
                get_task(stranger.session, created.task_id),
                update_task(stranger.session, created.task_id, {}),
                cancel_task(stranger.session, created.task_id),
            ):
                assert await _error(request) == (-32602, None)
            # A request that does not declare the extension may not use tasks, not even its own.
            required = {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
            assert await _error(get_task(plain.session, created.task_id)) == (-32021, required)
            assert await _error(cancel_task(plain.session, created.task_id)) == (-32021, required)
            # Without the extension the same tool still answers: mcpmux runs the task and waits for it.
            report = await plain.call_tool(RESEARCH, {"topic": "owls"})
            assert text_of(report).startswith("# Research Report: owls")
            assert (await wait_for(owner.session, created.task_id))["status"] == "completed"
            declined = await wait_for(owner.session, unasked.task_id)
            declined_text = declined["result"]["content"][0]["text"]
            assert declined_text.startswith("# Research Report: python (User declined - using default interpretation)")
        # notifications/tasks are the extension's too; mcpmux agrees to send none (clients poll tasks/get).
        refused = await _listen_for_tasks(url, TOKENS[0], {})
        assert refused["error"]["code"] == -32021
        assert refused["error"]["data"] == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
        acknowledged = await _listen_for_tasks(url, TOKENS[0], {"extensions": {EXTENSION: {}}})
        assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
        assert acknowledged["params"]["notifications"] == {"toolsListChanged": True}
        # A 2025 session is told of tasks as 2025-11-25 has them, and of no extension.
        async with _http_client(url, TOKENS[0], mode="legacy") as legacy:
            assert legacy.protocol_version == "2025-11-25"
            assert legacy.server_capabilities.extensions is None
            assert legacy.server_capabilities.tasks is not None


async def _listen_for_tasks(url: str, token: str, capabilities: dict[str, Any]) -> dict[str, Any]:
    """The first message of a `subscriptions/listen` asking for `notifications/tasks` (raw: the SDK's
    client has no word for `taskIds`)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    notifications = {"taskIds": ["everything.some-task"], "toolsListChanged": True}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "subscriptions/listen",
        "params": {"notifications": notifications, "_meta": meta},
    }
    headers = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "subscriptions/listen",
    }
    async with httpx2.AsyncClient(timeout=10) as http, http.stream("POST", url, json=body, headers=headers) as response:
        if response.headers.get("content-type", "").startswith("application/json"):
            return json.loads(await response.aread())
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                return json.loads(line[5:])
    raise AssertionError("the listen stream ended without a message")


# -- a 2026-07-28 upstream: the SDK 2.3 task server -------------------------------------------------


@contextmanager
def _task_server_over_http() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([PY, str(TASK_SERVER), "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def _seen(answer: dict[str, Any]) -> dict[str, Any]:
    """What a comparison looks at: all but the task id, the timestamps and the serverInfo stamp."""
    return {key: value for key, value in answer.items() if key not in ("taskId", "createdAt", "lastUpdatedAt", "_meta")}


def _created(result: Any) -> dict[str, Any]:
    assert isinstance(result, CreateTaskResult), result
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def _session_story(session: ClientSession, tool: str) -> tuple[dict[str, Any], list[str]]:
    """What one client sees of every kind of task the server makes: (observations, task ids)."""
    seen: dict[str, Any] = {}
    ids: list[str] = []
    report = _created(await session.call_tool(tool("report"), {"topic": "bees"}, allow_claimed=True))
    ids.append(report["taskId"])
    seen["report created"] = _seen(report)
    seen["report ended"] = _seen(await wait_for(session, report["taskId"]))

    greeting = _created(await session.call_tool(tool("greet"), {}, allow_claimed=True))
    ids.append(greeting["taskId"])
    seen["greet asks"] = _seen(await wait_for(session, greeting["taskId"], until=("input_required",)))
    answer = {"name-1": {"action": "accept", "content": {"name": "Luca"}}}
    seen["greet update"] = _seen(await update_task(session, greeting["taskId"], answer))
    seen["greet ended"] = _seen(await wait_for(session, greeting["taskId"]))

    failing = _created(await session.call_tool(tool("fail"), {}, allow_claimed=True))
    seen["fail ended"] = _seen(await wait_for(session, failing["taskId"]))

    cancelled = _created(await session.call_tool(tool("report"), {"topic": "ants"}, allow_claimed=True))
    seen["cancel"] = _seen(await cancel_task(session, cancelled["taskId"]))
    seen["cancel ended"] = _seen(await wait_for(session, cancelled["taskId"]))

    viewed = _created(await session.call_tool(tool("view"), {}, allow_claimed=True))
    seen["view ended"] = _seen(await wait_for(session, viewed["taskId"]))

    plain = await session.call_tool(tool("plain"), {"text": "hi"}, allow_claimed=True)
    seen["plain"] = text_of(plain)
    seen["unknown"] = await _error(get_task(session, "tasks.not-a-task"))
    return seen, ids


async def _story(client: Client, tool: Any) -> tuple[dict[str, Any], list[str]]:
    seen, ids = await _session_story(client.session, tool)
    seen["resolved"] = text_of(await client.call_tool(tool("report"), {"topic": "owls"}))
    return seen, ids


async def _plain_story(client: Client, tool: Any) -> dict[str, Any]:
    """What a client that did not declare the extension sees."""
    return {
        "report": text_of(await client.call_tool(tool("report"), {"topic": "bees"})),
        "only as a task": await _error(client.call_tool(tool("report_only_as_task"), {"topic": "bees"})),
    }


@pytest.mark.parametrize("upstream", ["stdio", "http"])
@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_a_2026_upstreams_tasks_are_relayed_as_they_are_served_directly(
    tmp_path: Path, upstream: str, front: str
) -> None:
    with nullcontext() if upstream == "stdio" else _task_server_over_http() as url:
        server: Any = StdioServerParameters(command=PY, args=[str(TASK_SERVER)], env=dict(os.environ))
        entry: dict[str, Any] = {"command": PY, "args": [str(TASK_SERVER)]}
        if url is not None:
            server, entry = url, {"url": url}
        async with Client(server, extensions=[TasksExtension()]) as direct_client:
            direct, _ = await _story(direct_client, lambda name: name)
        async with Client(server) as direct_client:
            direct_plain = await _plain_story(direct_client, lambda name: name)
        config = _config(tmp_path, {"tasks": entry})
        async with _through(front, config) as client:
            through, ids = await _story(client, lambda name: f"tasks__{name}")
        async with _through(front, config, tasks=False) as client:
            through_plain = await _plain_story(client, lambda name: f"tasks__{name}")
    # A view's ui:// URI in a task's result is named after its server, as in a tools/call result.
    view = json.dumps(direct.pop("view ended"))
    assert "ui://report/view.html" in view
    assert through.pop("view ended") == json.loads(view.replace("ui://report/", "ui://tasks+report/"))
    assert through == direct
    assert through_plain == direct_plain
    assert all(task_id.startswith("tasks.") for task_id in ids)
    assert direct["report ended"]["result"]["content"][0]["text"] == "report on bees"
    assert direct["greet ended"]["result"]["content"][0]["text"] == "Hello, Luca!"
    assert direct["fail ended"]["error"] == {"code": -32603, "message": "the upstream API is rate limited"}
    assert direct["cancel ended"]["status"] == "cancelled"
    assert direct_plain["only as a task"][0] == -32021
