"""A real client talks to mcpmux (stdio and HTTP, both protocol eras) and sees every upstream."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.e2e.conftest import demo, http_upstream, mux_over_http, mux_over_stdio, text_of, write_config

pytestmark = pytest.mark.anyio


@pytest.fixture
def two_demos(tmp_path: Path) -> Path:
    return write_config(tmp_path / "claude_desktop_config.json", {"alpha": demo("alpha"), "beta": demo("beta")})


async def _check_catalog_and_routing(client: Client) -> None:
    names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"alpha__echo", "beta__echo", "alpha__add", "beta__sleep"} <= names
    assert text_of(await client.call_tool("alpha__echo", {"text": "hi"})) == "alpha: hi"
    assert text_of(await client.call_tool("beta__echo", {"text": "hi"})) == "beta: hi"
    assert text_of(await client.call_tool("beta__add", {"a": 2, "b": 40})) == "42"

    failed = await client.call_tool("alpha__fail", {"reason": "no good"})
    assert failed.is_error

    with pytest.raises(MCPError, match="unknown tool 'alpha__nope'") as unknown:
        await client.call_tool("alpha__nope", {})
    assert unknown.value.code == -32602  # the client's error (invalid params), on every front and era

    prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
    assert {"alpha__summarize", "beta__summarize"} <= prompts
    prompt = await client.get_prompt("beta__summarize", {"topic": "cats"})
    assert "Summarize cats from beta." in json.dumps(prompt.model_dump(mode="json"))

    templates = (await client.list_resource_templates()).resource_templates
    assert any(t.uri_template == "demo://{server}/greeting" for t in templates)
    resource = await client.read_resource("demo://somewhere/greeting")
    assert resource.contents[0].text == "hello from somewhere"  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_stdio_front_serves_every_upstream(two_demos: Path, mode: str) -> None:
    async with mux_over_stdio(two_demos, mode=mode) as client:
        assert client.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
        await _check_catalog_and_routing(client)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_http_front_serves_every_upstream(tmp_path: Path, mode: str) -> None:
    with http_upstream("beta") as beta_url:
        config = write_config(tmp_path / "mcp.json", {"alpha": demo("alpha"), "beta": {"url": beta_url}})
        with mux_over_http(config) as url:
            async with Client(url, mode=mode) as client:
                await _check_catalog_and_routing(client)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_progress_is_relayed_to_the_caller(two_demos: Path, mode: str) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with mux_over_stdio(two_demos, mode=mode) as client:
        result = await client.call_tool("alpha__sleep", {"seconds": 0.3, "steps": 3}, progress_callback=on_progress)
    assert text_of(result) == "slept 0.3"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_client_cancellation_reaches_the_upstream(two_demos: Path) -> None:
    async with mux_over_stdio(two_demos) as client:
        with anyio.move_on_after(1.0):
            await client.call_tool("alpha__sleep", {"seconds": 30})
        # The upstream saw the call start and end early: a cancelled call leaves no orphaned work.
        with anyio.fail_after(10):
            while text_of(await client.call_tool("alpha__count", {"tool": "sleep_cancelled"})) != "1":
                await anyio.sleep(0.1)
        assert text_of(await client.call_tool("alpha__count", {"tool": "sleep"})) == "1"


async def test_many_concurrent_calls_over_http_each_get_their_own_answer(tmp_path: Path) -> None:
    with http_upstream("gamma") as gamma_url:
        servers = {"alpha": demo("alpha"), "beta": demo("beta"), "gamma": {"url": gamma_url}}
        config = write_config(tmp_path / "mcp.json", servers)
        with mux_over_http(config) as url:
            answers: dict[tuple[int, int], str] = {}

            async def one_client(client_id: int) -> None:
                mode = "legacy" if client_id % 2 else "auto"
                async with Client(url, mode=mode) as client, anyio.create_task_group() as calls:
                    for call_id in range(50):
                        calls.start_soon(one_call, client, client_id, call_id)

            async def one_call(client: Client, client_id: int, call_id: int) -> None:
                server = ("alpha", "beta", "gamma")[call_id % 3]
                result = await client.call_tool(f"{server}__echo", {"text": f"{client_id}/{call_id}"})
                answers[(client_id, call_id)] = text_of(result)

            with anyio.fail_after(120):
                async with anyio.create_task_group() as clients:
                    for client_id in range(4):
                        clients.start_soon(one_client, client_id)
    assert len(answers) == 200
    for (client_id, call_id), text in answers.items():
        assert text == f"{('alpha', 'beta', 'gamma')[call_id % 3]}: {client_id}/{call_id}"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_upstream_list_changed_reaches_the_client(two_demos: Path, mode: str) -> None:
    changed = anyio.Event()

    async def on_message(message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with mux_over_stdio(two_demos, mode=mode, message_handler=on_message) as client:
        async with anyio.create_task_group() as tasks:
            if mode == "auto":

                async def listen() -> None:
                    async with client.listen(tools_list_changed=True) as subscription:
                        async for _event in subscription:
                            changed.set()

                tasks.start_soon(listen)
                await anyio.sleep(0.3)
            await client.call_tool("beta__add_tool", {"name": "shiny"})
            with anyio.fail_after(10):
                await changed.wait()
            tasks.cancel_scope.cancel()
        names = {tool.name for tool in (await client.list_tools(cache_mode="refresh")).tools}
        assert "beta__shiny" in names
        assert text_of(await client.call_tool("beta__shiny", {})) == "shiny works"


async def test_a_2026_caller_that_asks_for_no_logs_hears_none(two_demos: Path) -> None:
    received: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.append(params)

    async with mux_over_stdio(two_demos, logging_callback=on_log) as client:  # fast path: no logLevel asked
        for _ in range(3):
            assert text_of(await client.call_tool("alpha__log", {"message": "the sky is blue"})) == "logged"
        assert text_of(await client.call_tool("alpha__echo", {"text": "after"})) == "alpha: after"
    assert received == []


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_upstream_logs_are_relayed_to_the_caller(two_demos: Path, mode: str) -> None:
    received: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.append(params)

    async with mux_over_stdio(two_demos, mode=mode, logging_callback=on_log, log_level="debug") as client:
        assert text_of(await client.call_tool("alpha__log", {"message": "the sky is blue"})) == "logged"
    # As the upstream wrote it: the demo server names no `logger`, and mcpmux adds none.
    assert [(p.level, p.data, p.logger) for p in received] == [("info", "the sky is blue", None)]


async def test_a_log_reaches_a_caller_once_however_many_of_its_calls_are_in_flight(two_demos: Path) -> None:
    received: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.append(params)

    client_of = mux_over_stdio(two_demos, mode="legacy", logging_callback=on_log, log_level="debug")
    async with client_of as client, anyio.create_task_group() as tasks:
        for _ in range(2):
            tasks.start_soon(client.call_tool, "alpha__sleep", {"seconds": 1.0})
        await anyio.sleep(0.3)  # both in flight
        assert text_of(await client.call_tool("alpha__log", {"message": "once"})) == "logged"
    assert [p.data for p in received] == ["once"]
