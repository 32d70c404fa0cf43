"""The raw JSON-RPC fast path for `tools/call` (mcpmux.mux.fast_path*), end to end on real processes.

Whether a call took the fast path is seen where it lands: the probe upstream below reports the
JSON-RPC id each call reached it with, a lane id (`mux.N`) on the fast path, the SDK's integer on
the SDK path. Every answer is compared with what an mcpmux with `fast_path = false` answers.

Run as a script, this file is that probe upstream: `python test_fastpath.py [http PORT]`.
"""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

if __name__ != "__main__":
    from mcpmux import Mux
    from mcpmux.core.inbound import Caller
    from mcpmux.mux.fast_path import FastCall, FastPath, Launched
    from tests.e2e.conftest import (
        free_port,
        mux_over_http,
        mux_over_stdio,
        served_in_process,
        stop,
        text_of,
        wait_for_port,
        write_config,
    )
    from tests.reliability.conftest import HttpFront

PROBE = Path(__file__).resolve()
RAW_SERVER = PROBE.parents[1] / "servers" / "raw_server.py"


def probe(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(PROBE)], **extra}


def seen_id(result: Any) -> Any:
    """The JSON-RPC id the probe's `whoami` was called with."""
    return json.loads(text_of(result))["id"]


def sent_by_mcpmux_http_client(result: Any) -> bool:
    """Whether the probe's `whoami` came over HTTP from mcpmux's own client (`mcpmux.upstream.http_lane`)."""
    seen = json.loads(text_of(result))
    return str(seen["id"]).startswith("mux.") and "encoding" in seen and seen["encoding"] is None


def dump(outcome: Any) -> Any:
    """A result or an error as the client sees it, for comparing two paths."""
    if isinstance(outcome, MCPError):
        return {"error": outcome.error.model_dump(by_alias=True, exclude_none=True)}
    if isinstance(outcome, dict):
        return outcome
    return outcome.model_dump(by_alias=True, exclude_none=True)


async def outcome_of(client: Client, name: str, arguments: dict[str, Any]) -> Any:
    try:
        return await client.call_tool(name, arguments)
    except MCPError as err:
        return err
    except RuntimeError as err:  # the client's own check of a result against the tool's output schema
        return {"client refused": str(err)}


@contextmanager
def probe_over_http(port: int | None = None, keep_alive: float = 5.0) -> Iterator[str]:
    """The probe upstream serving streamable HTTP on loopback; yields its URL.

    `keep_alive`: seconds it keeps an idle connection open (uvicorn's `timeout_keep_alive`).
    """
    port = port or free_port()
    command = [sys.executable, str(PROBE), "http", str(port), str(keep_alive)]
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


@pytest.fixture
def configs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Probe upstreams (stdio and HTTP, 2026 and 2025) behind an mcpmux with the fast path on, and one with it off."""
    cache = {"allow": ["cached"]}
    batch = [{"tool": "one", "batch_tool": "many", "argument": "item", "list_argument": "items"}]
    with probe_over_http() as url:
        servers = {"probe": probe(cache=cache, batch=batch), "old": probe(protocol="legacy", cache=cache)}
        servers["web"] = {"url": url, "cache": cache}
        servers["oldweb"] = {"url": url, "protocol": "legacy", "cache": cache}
        fast = write_config(tmp_path / "fast.json", servers)
        slow = write_config(tmp_path / "slow.json", servers, fast_path=False)
        yield fast, slow


WIDE = "héllo ✓ 🚀 \u2028 \x00 \\"
"""Text beyond ASCII (and characters JSON must escape), through both wires both ways."""

CALLS = [
    ("probe__whoami", {"text": "hi"}),
    ("old__whoami", {"text": "hi"}),
    ("web__whoami", {"text": "hi"}),
    ("oldweb__whoami", {"text": "hi"}),
    ("probe__shapes", {}),
    ("old__shapes", {}),
    ("web__shapes", {}),
    ("oldweb__shapes", {}),
    ("probe__fail", {}),
    ("probe__reject", {}),
    ("web__reject", {}),
    ("oldweb__reject", {}),
    ("oldweb__fail", {}),
    ("probe__nope", {}),
    ("probe__typed", {"structured": {"n": 1}}),
    ("probe__typed", {"structured": {"n": "one"}}),  # breaks its output schema
    ("probe__typed", {}),  # no structured content, though the tool declares an output schema
    ("web__typed", {"structured": {"n": "one"}}),
    ("oldweb__typed", {"structured": {"n": 1}}),
    ("probe__cached", {"text": "parity"}),
    ("oldweb__cached", {"text": "parity"}),
    ("web__shared", {"text": "parity"}),
    ("old__shared", {"text": "parity"}),
    ("probe__one", {"item": "parity"}),  # merged into a list-form `many` call
]


async def _concurrently(client: Client, name: str, count: int) -> list[Any]:
    """The ids the probe saw for `count` identical calls made at once."""
    ids: list[Any] = []

    async def one() -> None:
        ids.append(seen_id(await client.call_tool(name, {"text": "same"})))

    async with anyio.create_task_group() as tasks:
        for _ in range(count):
            tasks.start_soon(one)
    return ids


async def assert_same_answers(fast: Client, slow: Client) -> None:
    """The fast path is taken on `fast` and not on `slow`, and both answer every call alike."""
    for upstream in ("probe", "old", "web", "oldweb"):
        assert str(seen_id(await fast.call_tool(f"{upstream}__whoami", {}))).startswith("mux.")
        assert isinstance(seen_id(await slow.call_tool(f"{upstream}__whoami", {})), int)
    for upstream in ("web", "oldweb"):
        assert sent_by_mcpmux_http_client(await fast.call_tool(f"{upstream}__whoami", {}))
        assert not sent_by_mcpmux_http_client(await slow.call_tool(f"{upstream}__whoami", {}))
    for upstream in ("probe", "old", "web", "oldweb"):  # a call no one hears progress of asks for none
        assert not json.loads(text_of(await fast.call_tool(f"{upstream}__whoami", {})))["progress_asked"]
    for upstream in ("probe", "old", "web", "oldweb"):  # the arguments arrive as sent
        assert json.loads(text_of(await fast.call_tool(f"{upstream}__whoami", {"text": WIDE})))["text"] == WIDE
    for upstream in ("probe", "old", "web", "oldweb"):
        cached = f"{upstream}__cached"  # a tool the config caches, served by each path, then from the cache
        fast_first, slow_first = seen_id(await fast.call_tool(cached, {})), seen_id(await slow.call_tool(cached, {}))
        assert str(fast_first).startswith("mux.")
        assert isinstance(slow_first, int)
        assert seen_id(await fast.call_tool(cached, {})) == fast_first
        assert seen_id(await slow.call_tool(cached, {})) == slow_first
        shared = f"{upstream}__shared"  # read-only and idempotent: identical calls at once share one call
        fast_ids, slow_ids = await _concurrently(fast, shared, 5), await _concurrently(slow, shared, 5)
        assert len(set(fast_ids)) == 1
        assert str(fast_ids[0]).startswith("mux.")
        assert len(set(slow_ids)) == 1
        assert isinstance(slow_ids[0], int)
        assert await _concurrently(fast, shared, 1) != fast_ids[:1]  # in flight only: nothing was kept
    for name, arguments in CALLS:
        fast_outcome, slow_outcome = (
            dump(await outcome_of(fast, name, arguments)),
            dump(await outcome_of(slow, name, arguments)),
        )
        if name.endswith(("whoami", "cached", "shared", "one")):  # the ids differ by design
            assert [json.loads(block["text"]).get("item") for block in fast_outcome["content"]] == [
                json.loads(block["text"]).get("item") for block in slow_outcome["content"]
            ]
            fast_outcome["content"] = slow_outcome["content"] = None
        assert fast_outcome == slow_outcome, name
    assert dump(await outcome_of(fast, "probe__reject", {})) == {
        "error": {"code": -32042, "message": "the probe refuses", "data": {"why": "asked to"}}
    }
    broken = await fast.call_tool("probe__typed", {"structured": {"n": "one"}})
    assert broken.is_error
    assert "breaks the tool's declared output schema: 'one' is not of type 'integer'" in text_of(broken)
    assert (await fast.call_tool("probe__typed", {"structured": {"n": 1}})).structured_content == {"n": 1}


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_fast_path_answers_stdio_clients_exactly_as_the_sdk_path(configs: tuple[Path, Path], mode: str) -> None:
    fast_config, slow_config = configs
    async with mux_over_stdio(fast_config, mode=mode) as fast, mux_over_stdio(slow_config, mode=mode) as slow:
        await assert_same_answers(fast, slow)


@pytest.mark.slow
@pytest.mark.anyio
async def test_fast_path_answers_http_clients_exactly_as_the_sdk_path(configs: tuple[Path, Path]) -> None:
    fast_config, slow_config = configs
    with mux_over_http(fast_config) as fast_url, mux_over_http(slow_config) as slow_url:
        for mode in ("auto", "legacy"):
            async with Client(fast_url, mode=mode) as fast, Client(slow_url, mode=mode) as slow:
                await assert_same_answers(fast, slow)


@contextmanager
def upstream_entry(kind: str) -> Iterator[dict[str, Any]]:
    """The probe as a config entry: over stdio, or over HTTP in either era (mcpmux's own HTTP client)."""
    if kind == "stdio":
        yield probe()
        return
    with probe_over_http() as url:
        yield {"url": url, "protocol": "legacy" if kind == "http-2025" else "auto"}


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["stdio", "http-2026", "http-2025"])
async def test_progress_and_cancellation_on_the_fast_path(tmp_path: Path, kind: str) -> None:
    with upstream_entry(kind) as entry:
        config = write_config(tmp_path / "mux.json", {"probe": entry})
        async with mux_over_stdio(config) as client:
            steps: list[tuple[float, float | None, str | None]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                steps.append((progress, total, message))

            result = await client.call_tool("probe__slow", {"seconds": 0.2, "steps": 3}, progress_callback=on_progress)
            assert str(seen_id(result)).startswith("mux.")
            assert steps == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
            assert not json.loads(text_of(await client.call_tool("probe__whoami", {})))["progress_asked"]

            with anyio.move_on_after(0.5):
                await client.call_tool("probe__slow", {"seconds": 30})
            cancelled: list[Any] = []
            # The upstream hears of it as soon as it reads the cancellation (on 2026 HTTP: its connection closes).
            with anyio.fail_after(10):
                while not cancelled:
                    cancelled = json.loads(text_of(await client.call_tool("probe__cancelled", {})))
                    await anyio.sleep(0.05)
            assert len(cancelled) == 1
            assert str(cancelled[0]).startswith("mux.")
            # The lane and the connection are fine afterwards.
            after = await client.call_tool("probe__whoami", {})
            assert str(seen_id(after)).startswith("mux.")
            assert kind == "stdio" or sent_by_mcpmux_http_client(after)


@pytest.mark.anyio
async def test_a_log_written_just_before_the_result_reaches_the_caller_first(tmp_path: Path) -> None:
    """The upstream writes a log line and the result in one go: a 2025 caller hears them in that order.

    mcpmux answers a fast-path result straight from the code that reads it off the upstream's pipe,
    while the log goes through the SDK's session; the result must not overtake it.
    """
    config = write_config(tmp_path / "mux.json", {"raw": {"command": sys.executable, "args": [str(RAW_SERVER)]}})
    received: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.append(params.data)

    async with mux_over_stdio(config, mode="legacy", logging_callback=on_log, log_level="debug") as client:
        for n in range(20):
            assert text_of(await client.call_tool("raw__log_then_answer", {"message": f"line {n}"})) == "answered"
            assert received == [f"line {i}" for i in range(n + 1)]


@pytest.mark.anyio
async def test_the_upstreams_concurrency_limit_holds_on_the_fast_path(tmp_path: Path) -> None:
    """Calls past `max_concurrency` wait their turn (the fast path sends at once only when admitted at once)."""
    config = write_config(tmp_path / "mux.json", {"probe": probe(limits={"max_concurrency": 2})})
    async with mux_over_stdio(config) as client:
        seen: list[Any] = []

        async def one() -> None:
            seen.append(seen_id(await client.call_tool("probe__slow", {"seconds": 0.2})))

        async with anyio.create_task_group() as tasks:
            for _ in range(8):
                tasks.start_soon(one)
        assert len(seen) == 8
        assert all(str(request_id).startswith("mux.") for request_id in seen)
        assert json.loads(text_of(await client.call_tool("probe__peak", {}))) == 2


@pytest.mark.anyio
async def test_calls_waiting_their_turn_on_the_fast_path_time_out_overflow_and_cancel_as_on_the_sdk_path(
    tmp_path: Path,
) -> None:
    """Calls past `max_concurrency` wait in the gate's line without a task; its limits read as on the SDK path."""
    limits = {"max_concurrency": 1, "max_queue": 2, "queue_timeout": 0.5}
    servers = {"probe": probe(limits=limits)}
    fast_config = write_config(tmp_path / "fast.json", servers)
    slow_config = write_config(tmp_path / "slow.json", servers, fast_path=False)

    async def crowd(client: Client) -> list[Any]:
        """A 1 s call, then three that queue behind it: two wait too long, one finds the line full."""
        results: list[Any] = []

        async def call(seconds: float) -> None:
            results.append(await client.call_tool("probe__slow", {"seconds": seconds}))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call, 1.0)
            await anyio.sleep(0.2)
            for _ in range(3):
                tasks.start_soon(call, 0.01)
                await anyio.sleep(0.02)
        return results

    async with mux_over_stdio(fast_config) as fast, mux_over_stdio(slow_config) as slow:
        fast_results, slow_results = await crowd(fast), await crowd(slow)
        for results in (fast_results, slow_results):
            refusals = sorted(text_of(result) for result in results if result.is_error)
            assert len(refusals) == 3, refusals
            assert "is full (max_queue=2)" in refusals[-1]
            assert all("timeout=0.500s" in text and "waiting for admission" in text for text in refusals[:2])
        (answered,) = [result for result in fast_results if not result.is_error]  # the 1 s call
        assert str(seen_id(answered)).startswith("mux.")

        # A call cancelled while it waits its turn never reaches the upstream; the line goes on.
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(fast.call_tool, "probe__slow", {"seconds": 0.5})
            await anyio.sleep(0.1)
            with anyio.move_on_after(0.2):
                await fast.call_tool("probe__whoami", {"tag": "cancelled while waiting"})
            after = await fast.call_tool("probe__whoami", {"tag": "after"})
        assert json.loads(text_of(after))["tag"] == "after"
        assert json.loads(text_of(await fast.call_tool("probe__tags", {}))) == ["after"]
        assert json.loads(text_of(await fast.call_tool("probe__peak", {}))) == 1


@pytest.mark.anyio
async def test_fast_path_calls_leave_nothing_for_the_cycle_collector(tmp_path: Path) -> None:
    """A fast-path call's objects are freed when it ends, also for calls that waited their turn.

    mcpmux's own process is not ours to inspect, so the fast path runs here, in the test, over a
    real upstream process, with the collector saving whatever it would have had to free.
    """
    config = write_config(tmp_path / "mux.json", {"probe": probe(limits={"max_concurrency": 2})})
    async with Mux.from_config(config) as mux:
        fast = FastPath(mux, {"name": "mcpmux", "version": "test"})
        answers: dict[int, Any] = {}
        done = anyio.Event()

        def send(request_id: int, tasks: Any) -> None:
            message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
            message["params"] = {"name": "probe__whoami", "arguments": {"tag": request_id}}
            call = fast.route(message, Caller(), "2025-11-25")
            assert isinstance(call, FastCall)

            def deliver_now(response: dict[str, Any]) -> bool:
                answers[request_id] = response
                if len(answers) == 20:
                    done.set()
                return True

            async def finish() -> None:
                response = await fast.answer(call, launched=launched)
                deliver_now(response)

            launched = fast.launch(call, deliver_now, lambda: tasks.start_soon(finish))
            assert launched is not None  # sent at once, or waiting in the gate's line

        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            async with anyio.create_task_group() as tasks:
                for request_id in range(20):
                    send(request_id, tasks)
                with anyio.fail_after(20):
                    await done.wait()
            gc.collect()
            left = [type(thing).__name__ for thing in gc.garbage if isinstance(thing, Launched | FastCall)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert sorted(json.loads(answers[i]["result"]["content"][0]["text"])["tag"] for i in answers) == list(range(20))
    assert left == []


@pytest.mark.slow
@pytest.mark.anyio
async def test_http_clients_of_both_eras_cancel_fast_path_calls(tmp_path: Path) -> None:
    config = write_config(tmp_path / "mux.json", {"probe": probe()})
    with mux_over_http(config) as url:
        for expected, mode in enumerate(("auto", "legacy"), start=1):  # closing the stream; notifications/cancelled
            async with Client(url, mode=mode) as client:
                with anyio.move_on_after(0.5):
                    await client.call_tool("probe__slow", {"seconds": 30})
                cancelled: list[Any] = []
                with anyio.fail_after(10):
                    while len(cancelled) < expected:
                        cancelled = json.loads(text_of(await client.call_tool("probe__cancelled", {})))
                        await anyio.sleep(0.05)
                assert str(cancelled[-1]).startswith("mux.")
                assert str(seen_id(await client.call_tool("probe__whoami", {}))).startswith("mux.")


def _whoami(front: HttpFront, request_id: int, deep: str) -> Any:
    """POST a `whoami` call whose `deep` argument is the raw JSON `deep`; the JSON-RPC answer to it."""
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": "probe__whoami", "arguments": {"deep": "DEEP"}}})  # fmt: skip
    answer = front.exchange(body.replace('"DEEP"', deep).encode(), request_id)
    assert answer.status < 500, answer
    (message,) = answer.messages
    return message


def test_arguments_nested_past_the_sdk_parser_are_refused_and_the_upstream_lives_on(tmp_path: Path) -> None:
    """Nesting the SDK cannot parse is refused as on the SDK path; it never reaches (and breaks) the upstream."""
    config = write_config(tmp_path / "mux.json", {"probe": probe()})
    with mux_over_http(config) as url, closing(HttpFront(url, timeout=30, capabilities={"roots": {}})) as front:
        # A 2025 client that can be asked: its first list starts its 2025 session with the upstream.
        front.exchange(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "tools/list"}).encode(), 0)
        served = _whoami(front, 1, "[" * 100 + "]" * 100)  # within the parser's limit
        assert str(json.loads(served["result"]["content"][0]["text"])["id"]).startswith("mux.")
        for request_id, depth in enumerate((220, 300, 900, 20_000), start=2):
            refused = _whoami(front, request_id, "[" * depth + "]" * depth)
            assert refused["error"]["code"] in (types.PARSE_ERROR, types.INVALID_REQUEST), refused
            again = _whoami(front, 100 + request_id, '"fine"')
            seen = json.loads(again["result"]["content"][0]["text"])  # the same connection, still on the fast path
            assert seen["deep"] == "fine"
            assert str(seen["id"]).startswith("mux."), again


@pytest.mark.slow
@pytest.mark.anyio
async def test_timeout_and_crash_read_as_on_the_sdk_path(tmp_path: Path) -> None:
    servers = {"probe": probe(timeout=1)}
    fast_config = write_config(tmp_path / "fast.json", servers)
    slow_config = write_config(tmp_path / "slow.json", servers, fast_path=False)
    async with mux_over_stdio(fast_config) as fast, mux_over_stdio(slow_config) as slow:
        asked = anyio.current_time()
        timed_out = await fast.call_tool("probe__slow", {"seconds": 5})
        assert anyio.current_time() - asked < 1.7  # the timeout runs from the request, once
        assert timed_out.is_error
        assert "did not answer tool 'slow' within 1s" in text_of(timed_out)
        assert dump(timed_out) == dump(await slow.call_tool("probe__slow", {"seconds": 5}))
        cancelled = json.loads(text_of(await fast.call_tool("probe__cancelled", {})))
        assert [str(request_id)[:4] for request_id in cancelled] == ["mux."]  # the upstream was told

        # Several calls in flight when the upstream dies: each gets the unavailable error, none hangs.
        with anyio.fail_after(20):
            crashed = await _crash_with_calls_in_flight(fast)
            crashed_slow = await _crash_with_calls_in_flight(slow)
        assert all(result.is_error and "lost its connection" in text_of(result) for result in crashed)
        assert [dump(result) for result in crashed] == [dump(result) for result in crashed_slow]
        with anyio.fail_after(20):  # reconnected ...
            while (await fast.call_tool("probe__whoami", {})).is_error:
                await anyio.sleep(0.1)
        # ... and on the fast path again (a call routed while it reconnected may have taken the SDK path)
        assert str(seen_id(await fast.call_tool("probe__whoami", {}))).startswith("mux.")


async def _crash_with_calls_in_flight(client: Client) -> list[Any]:
    results: list[Any] = []

    async def call(name: str, arguments: dict[str, Any]) -> None:
        results.append(await client.call_tool(name, arguments))

    async with anyio.create_task_group() as tasks:
        for _ in range(3):
            tasks.start_soon(call, "probe__slow", {"seconds": 0.4})
        await anyio.sleep(0.1)
        tasks.start_soon(call, "probe__crash", {})
    return sorted(results, key=text_of)


@pytest.mark.slow
@pytest.mark.anyio
async def test_two_hundred_concurrent_calls_from_several_clients_each_get_their_own_answer(tmp_path: Path) -> None:
    config = write_config(tmp_path / "mux.json", {"probe": probe(), "old": probe(protocol="legacy")})
    with mux_over_http(config) as url:
        async with Client(url) as first, Client(url, mode="legacy") as second, Client(url) as third:
            ids: list[Any] = []

            async def call(client: Client, index: int) -> None:
                result = await client.call_tool(("probe__whoami", "old__whoami")[index % 2], {"tag": index})
                answer = json.loads(text_of(result))
                assert answer["tag"] == index
                ids.append(answer["id"])

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tasks:
                    for index in range(200):
                        tasks.start_soon(call, (first, second, third)[index % 3], index)
    assert len(ids) == 200
    assert all(str(request_id).startswith("mux.") for request_id in ids)


@pytest.mark.anyio
async def test_calls_that_need_the_mux_are_served_by_its_one_executor(tmp_path: Path) -> None:
    """Calls the fast front cannot take (a per-client cache, a list form, a local tool's inner call)
    reach the same executor, whose upstream request goes raw over the lane (`mux.N`), except a list
    form's merged call, which the SDK's client sends (an int id), and a call whose client hears its
    logs through the SDK's front (the SDK's client hands the call's logs on before its result)."""
    servers = {
        "probe": probe(
            batch=[{"tool": "one", "batch_tool": "many", "argument": "item", "list_argument": "items"}],
            cache={"allow": ["cached"], "scope": "client"},
        )
    }
    config = write_config(tmp_path / "mux.json", servers)
    async with mux_over_stdio(config) as client:
        assert str(seen_id(await client.call_tool("probe__whoami", {}))).startswith("mux.")
        cached = seen_id(await client.call_tool("probe__cached", {}))  # cached per client: the SDK's front
        assert str(cached).startswith("mux.")  # a 2026 request asking for no logs
        assert seen_id(await client.call_tool("probe__cached", {})) == cached  # served from the cache
    async with mux_over_stdio(config, mode="legacy") as client:  # a 2025 session hears the upstream's logs
        assert isinstance(seen_id(await client.call_tool("probe__cached", {})), int)
        batched = await client.call_tool("probe__one", {"item": "x"})
        assert isinstance(json.loads(text_of(batched))["id"], int)  # merged into a `many` call
        steps = [{"tool": "probe__whoami", "arguments": {}}]
        parallel = await client.call_tool("mux_parallel", {"calls": steps})  # a local tool
        inner = parallel.structured_content["results"][0]["result"]["text"]
        assert str(json.loads(inner)["id"]).startswith("mux.")


@pytest.mark.anyio
async def test_a_2025_http_client_that_can_be_asked_keeps_the_fast_path(tmp_path: Path) -> None:
    """Clients such as VS Code declare elicitation and sampling. While such a session's standalone
    stream is open, what an upstream asks of the client can reach it there, so its calls are relayed
    raw (an `mux.` id: mcpmux's own lane) rather than through the SDK (an int id)."""
    config = write_config(tmp_path / "mux.json", {"probe": probe()})

    async def decline(context: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async with (
        served_in_process(config) as (_mux, _frontend, url),
        Client(url, mode="legacy", elicitation_callback=decline) as client,
    ):
        with anyio.fail_after(10):  # the client opens its standalone stream just after connecting
            while not str(seen_id(await client.call_tool("probe__whoami", {}))).startswith("mux."):
                await anyio.sleep(0.05)
        assert str(seen_id(await client.call_tool("probe__whoami", {}))).startswith("mux.")


@pytest.mark.anyio
async def test_identical_calls_share_one_flight_whichever_path_they_take(tmp_path: Path) -> None:
    """Calls relayed raw from an HTTP client and library calls (`Mux.call_tool`) to a read-only,
    idempotent tool, made at once, are answered by one upstream call: the two paths have one executor."""
    config = write_config(tmp_path / "mux.json", {"probe": probe()})
    async with served_in_process(config) as (mux, _frontend, url), Client(url) as client:
        ids: list[Any] = []

        async def over_http() -> None:
            ids.append(seen_id(await client.call_tool("probe__shared", {"text": "same"})))

        async def in_process() -> None:
            ids.append(seen_id(await mux.call_tool("probe__shared", {"text": "same"})))

        async with anyio.create_task_group() as tasks:
            for index in range(6):
                tasks.start_soon((over_http, in_process)[index % 2])
    assert len(ids) == 6
    assert len(set(ids)) == 1, ids


@pytest.mark.anyio
async def test_a_stdio_client_that_can_sample_keeps_the_fast_path_and_is_asked(tmp_path: Path) -> None:
    """A 2025 client declaring sampling on stdio: its calls are relayed raw, and an upstream's sampling
    request during one of them is asked of that client, on its session (a 2025 session of its own with
    the upstream, which speaks both eras: `mcpmux.mux.sessions`)."""
    asked: list[str] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        content = params.messages[0].content
        assert isinstance(content, types.TextContent)
        asked.append(content.text)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="hi"), model="the-client's"
        )

    config = write_config(tmp_path / "mux.json", {"probe": probe(sampling={"policy": "client"})})
    async with mux_over_stdio(config, mode="legacy", sampling_callback=sample) as client:
        await client.list_tools()  # the session is set up once `notifications/initialized` is handled
        assert str(seen_id(await client.call_tool("probe__whoami", {}))).startswith("mux.")  # the fast path
        answered = await client.call_tool("probe__ask", {})
        first_legs = json.loads(text_of(await client.call_tool("probe__asked", {})))
    assert json.loads(text_of(answered)) == {"answered": True}
    assert asked == ["say hi"]
    assert str(first_legs[0]).startswith("mux.")  # the sampling call went out on the fast path


@pytest.mark.anyio
async def test_an_input_required_round_is_driven_on_the_call_that_got_it(tmp_path: Path) -> None:
    """A 2026 upstream's input-required result is answered on the call it came to, and that same call is
    sent again with the answers: never sent afresh through another client (which would run it twice)."""
    servers = {"probe": probe(sampling={"policy": "off"})}
    fast_config = write_config(tmp_path / "fast.json", servers)
    slow_config = write_config(tmp_path / "slow.json", servers, fast_path=False)
    async with mux_over_stdio(fast_config) as fast, mux_over_stdio(slow_config) as slow:
        fast_outcome = dump(await outcome_of(fast, "probe__ask", {}))
        assert fast_outcome == dump(await outcome_of(slow, "probe__ask", {}))
        assert "error" in fast_outcome  # sampling is off for this upstream: the round fails, saying so
        first_legs = json.loads(text_of(await fast.call_tool("probe__asked", {})))
    assert len(first_legs) == 1  # asked once ...
    assert str(first_legs[0]).startswith("mux.")  # ... on the fast path


@pytest.mark.anyio
async def test_the_fast_path_says_why_it_leaves_a_call_to_the_sdk_path(tmp_path: Path) -> None:
    """Each call the direct mode does not serve is counted under its reason, at /metrics."""
    config = write_config(tmp_path / "mux.json", {"probe": probe()})
    async with served_in_process(config) as (_, _, url):

        async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            return types.ElicitResult(action="decline")

        async def progress(done: float, total: float | None, message: str | None) -> None:
            """Asking for progress over HTTP needs the SDK's event stream."""

        async with Client(url, mode="auto") as plain, Client(url, mode="auto", elicitation_callback=elicit) as asking:
            await plain.call_tool("probe__whoami", {})  # relayed raw: no reason counted
            await asking.call_tool("probe__whoami", {})  # the upstream may ask this client: parked for rounds
            await plain.call_tool("probe__whoami", {}, progress_callback=progress)
        async with httpx2.AsyncClient() as http:
            scraped = (await http.get(url.replace("/mcp", "/metrics"))).text
    counted = dict(re.findall(r'mcpmux_sdk_path_calls_total\{reason="(\w+)"\} (\S+)', scraped))
    assert counted == {"asks_client": "1.0", "front": "1.0"}


# -- the probe upstream ---------------------------------------------------------------------------


def _serve_probe() -> None:
    """A low-level SDK server whose tools report the JSON-RPC id they were called with."""
    import os

    import mcp_types as types
    import uvicorn
    from mcp.server.lowlevel.server import NotificationOptions, Server
    from mcp.server.stdio import stdio_server
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    cancelled: list[Any] = []
    asked: list[Any] = []
    running = [0, 0]  # `slow` calls running now, and the most at once
    schema = {"type": "object"}
    tags: list[Any] = []  # the `tag` of each `whoami` call that reached the probe
    names = ["whoami", "shapes", "fail", "reject", "slow", "peak", "cancelled", "ask", "asked", "crash"]
    names += ["cached", "one", "many", "tags"]
    tools = [types.Tool(name=name, input_schema=schema) for name in names]
    repeatable = types.ToolAnnotations(read_only_hint=True, idempotent_hint=True)
    tools.append(types.Tool(name="shared", input_schema=schema, annotations=repeatable))
    typed = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tools.append(types.Tool(name="typed", input_schema=schema, output_schema=typed))

    def http_marks(ctx: Any) -> dict[str, Any]:
        """Over HTTP, the request's Accept-Encoding: mcpmux's own client sends none, httpx asks for gzip."""
        headers = getattr(getattr(ctx, "request", None), "headers", None)
        return {} if headers is None else {"encoding": headers.get("accept-encoding")}

    def text(value: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(value))])

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == "tags":
            return text(tags)
        if params.name == "shared":
            await anyio.sleep(0.3)  # long enough for identical calls made at once to find it in flight
        if params.name in ("whoami", "cached", "shared"):
            if "tag" in arguments:
                tags.append(arguments["tag"])
            asked_progress = "progress_token" in (params.meta or {})
            return text({"id": ctx.request_id, "progress_asked": asked_progress, **arguments, **http_marks(ctx)})
        if params.name == "one":
            return text({"id": ctx.request_id, "item": arguments["item"]})
        if params.name == "many":
            return types.CallToolResult(
                content=[
                    types.TextContent(type="text", text=json.dumps({"id": ctx.request_id, "item": item}))
                    for item in arguments["items"]
                ]
            )
        if params.name == "shapes":
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="a"), types.TextContent(type="text", text=WIDE)],
                structured_content={"answer": 42, "nested": {"list": [1, None, "x"]}},
                _meta={"probe/extra": True},
            )
        if params.name == "typed":  # structured content that does, or does not, match the output schema
            structured = arguments.get("structured")
            return types.CallToolResult(content=[types.TextContent(type="text", text="typed")],
                                        structured_content=structured)  # fmt: skip
        if params.name == "fail":
            return types.CallToolResult(content=[types.TextContent(type="text", text="failed")], is_error=True)
        if params.name == "reject":
            raise MCPError(code=-32042, message="the probe refuses", data={"why": "asked to"})
        if params.name == "slow":
            steps = int(arguments.get("steps", 1))
            running[0] += 1
            running[1] = max(running)
            try:
                for step in range(steps):
                    await anyio.sleep(float(arguments["seconds"]) / steps)
                    await ctx.session.report_progress(step + 1, steps, f"step {step + 1}")
            except anyio.get_cancelled_exc_class():
                cancelled.append(ctx.request_id)
                raise
            finally:
                running[0] -= 1
            return text({"id": ctx.request_id})
        if params.name == "peak":  # the most `slow` calls that ran at once
            return text(running[1])
        if params.name == "cancelled":
            return text(cancelled)
        if params.name == "ask":  # sampling, then the answer: in 2026 an input-required round, in 2025 a request
            if not params.input_responses:
                asked.append(ctx.request_id)
                content = types.TextContent(type="text", text="say hi")
                messages = [types.SamplingMessage(role="user", content=content)]
                if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                    await ctx.session.create_message(messages=messages, max_tokens=5)
                    return text({"answered": True})
                sampling = types.CreateMessageRequestParams(messages=messages, max_tokens=5)
                requests = {"s1": types.CreateMessageRequest(params=sampling)}
                return types.InputRequiredResult(input_requests=requests, request_state="asked")
            return text({"answered": True})
        if params.name == "asked":
            return text(asked)
        os._exit(3)  # crash

    server = Server("probe", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)
    if sys.argv[1:2] == ["http"]:
        app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
        keep_alive = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", timeout_keep_alive=keep_alive)
        return

    async def serve() -> None:
        async with stdio_server() as (read_stream, write_stream):
            options = server.create_initialization_options(NotificationOptions())
            await server.run(read_stream, write_stream, options)

    anyio.run(serve)


if __name__ == "__main__":
    _serve_probe()
