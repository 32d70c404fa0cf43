"""Load: many clients, thousands of calls across stdio and HTTP upstreams and the local engine, each
answered exactly once with its own content; and raw pipelined ids over stdio, none lost, doubled or crossed."""

from __future__ import annotations

import collections
import queue
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcpmux.inference.engine.async_engine import Engine
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from tests.e2e.conftest import text_of
from tests.inference.tiny_models import build_tiny_model
from tests.reliability.conftest import (
    DEMO,
    FAULT,
    RawStdio,
    http_mux,
    http_server,
    stdio_upstream,
    write_config,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CLIENTS = 20
# The 20 x 500: about 90 s on a busy 2-core box, most of it in the 20 SDK clients of this process.
CALLS_PER_CLIENT = 500
LANES_PER_CLIENT = 4  # concurrent calls in flight on each client's session
LOCAL_EVERY = 50  # one call in 50 is a local generate of a few tokens
PROMPTS = ("The quick brown fox", "Paged attention stores")
LOCAL_TOKENS = 3


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("load") / "llama")


@pytest.fixture(scope="module")
async def expected_local(tiny_model: Path) -> AsyncIterator[dict[str, str]]:
    """What the local tool must answer for each prompt: the same greedy request on an engine of our own."""
    params = SamplingParams(max_tokens=LOCAL_TOKENS, temperature=0)
    async with await Engine.start(EngineConfig(model=str(tiny_model), kv_cache_memory_mb=16)) as engine:
        yield {prompt: (await engine.complete(prompt, params)).text for prompt in PROMPTS}


Plan = list[tuple[str, dict[str, object], str]]


def _plan(client: int) -> Plan:
    """Per call: tool, arguments, the text it must answer. Tokens are unique across the whole run."""
    calls = []
    for i in range(CALLS_PER_CLIENT):
        if i % LOCAL_EVERY == LOCAL_EVERY - 1:
            prompt = PROMPTS[(client + i) % len(PROMPTS)]
            arguments = {"prompt": prompt, "max_tokens": LOCAL_TOKENS, "temperature": 0}
            calls.append(("local__generate", arguments, prompt))
            continue
        upstream = ("alpha", "beta", "web")[(client + i) % 3]
        token = f"{client}-{i}-{uuid.uuid4().hex[:8]}"
        calls.append((f"{upstream}__echo", {"text": token}, f"{upstream}: {token}"))
    return calls


@dataclass(slots=True)
class ClientTally:
    """What one client got back: each expected echo answer with its count, and right local answers."""

    echoes: collections.Counter[str] = field(default_factory=collections.Counter)
    local_right: int = 0
    wrong: list[str] = field(default_factory=list)


async def _client_run(url: str, client: int, plan: Plan, expected_local: dict[str, str]) -> ClientTally:
    """One client's calls, `LANES_PER_CLIENT` at a time over one session."""
    tally = ClientTally()
    mode = "legacy" if client % 2 else "auto"  # both protocol eras at once

    async with Client(url, mode=mode) as session:

        async def lane(lane_index: int) -> None:
            for tool, arguments, expected in plan[lane_index::LANES_PER_CLIENT]:
                result = await session.call_tool(tool, arguments)
                got = text_of(result)
                if tool == "local__generate":
                    if not result.is_error and got == expected_local[expected]:
                        tally.local_right += 1
                    else:
                        tally.wrong.append(f"{tool} {expected!r}: got {got!r}")
                elif not result.is_error and got == expected:
                    tally.echoes[got] += 1
                else:
                    tally.wrong.append(f"{tool} {arguments}: wanted {expected!r}, got {got!r}")

        async with anyio.create_task_group() as lanes:
            for lane_index in range(LANES_PER_CLIENT):
                lanes.start_soon(lane, lane_index)
    return tally


async def test_twenty_clients_each_call_answered_once_with_its_own_content(
    tmp_path: Path, run_id: str, tiny_model: Path, expected_local: dict[str, str]
) -> None:
    with http_server(DEMO, "web", run_id) as web:
        servers = {"alpha": stdio_upstream("alpha"), "beta": stdio_upstream("beta", FAULT), "web": {"url": web.url}}
        config = write_config(tmp_path / "mux.json", servers, model=tiny_model, call_timeout=60)
        with http_mux(config, run_id, tmp_path / "mux.log") as mux:
            started = time.monotonic()
            tallies = [ClientTally() for _ in range(CLIENTS)]
            plans = [_plan(client) for client in range(CLIENTS)]

            async def run(client: int) -> None:
                tallies[client] = await _client_run(mux.url, client, plans[client], expected_local)

            with anyio.fail_after(600):
                async with anyio.create_task_group() as clients:
                    for client in range(CLIENTS):
                        clients.start_soon(run, client)
            elapsed = time.monotonic() - started
    for client, (plan, tally) in enumerate(zip(plans, tallies, strict=True)):
        assert not tally.wrong, f"client {client}: {len(tally.wrong)} wrong answers, first: {tally.wrong[:3]}"
        echoes = {expected for tool, _, expected in plan if tool != "local__generate"}
        assert set(tally.echoes) == echoes, f"client {client}: {len(echoes - set(tally.echoes))} calls unanswered"
        assert set(tally.echoes.values()) == {1}, f"client {client}: an answer came back twice"
        assert tally.local_right == len(plan) - len(echoes)
    print(f"{CLIENTS} clients x {CALLS_PER_CLIENT} calls in {elapsed:.1f}s")


async def test_pipelined_raw_ids_over_stdio_are_answered_exactly_once(tmp_path: Path, run_id: str) -> None:
    """Hundreds of requests in flight on one pipe, with ids 7 and "7" both in use: each id gets one
    response, carrying the token its own request sent."""
    config = write_config(tmp_path / "mux.json", {"alpha": stdio_upstream("alpha"), "beta": stdio_upstream("beta")})
    with (tmp_path / "mux.log").open("wb") as log:
        mux = RawStdio(config, run_id, log)
        try:
            mux.initialize()
            expected: dict[str, str] = {}
            ids: list[int | str] = []
            for n in range(600):
                request_id: int | str = n // 2 if n % 2 else str(n // 2)  # 0, "0", 1, "1", ...
                upstream = ("alpha", "beta")[n % 2]
                token = uuid.uuid4().hex
                ids.append(request_id)
                expected[repr(request_id)] = f"{upstream}: {token}"
                params = {"name": f"{upstream}__echo", "arguments": {"text": token}}
                mux.send_json({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
            answers: collections.Counter[str] = collections.Counter()
            crossed = []
            deadline = time.monotonic() + 120
            while sum(answers.values()) < len(ids):
                try:
                    line = mux.receive(max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    break
                assert isinstance(line, dict), f"unexpected line: {line!r}"
                if line.get("method") == "notifications/tools/list_changed":
                    continue  # an upstream's arrival, told after the first list's answer
                assert "id" in line, f"unexpected line: {line!r}"
                key = repr(line["id"])
                answers[key] += 1
                text = "".join(block.get("text", "") for block in line.get("result", {}).get("content", []))
                if text != expected.get(key):
                    crossed.append((key, text, expected.get(key)))
        finally:
            assert mux.close() == 0
    assert not crossed, f"answers not matching their request: {crossed[:3]}"
    assert set(answers) == {repr(request_id) for request_id in ids}, "some ids got no response"
    assert set(answers.values()) == {1}, "some ids got more than one response"
