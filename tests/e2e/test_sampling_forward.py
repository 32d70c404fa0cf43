"""Upstream sampling forwarded to 2026-07-28 clients, which have no back channel, in input-required rounds.

A real `mcp.Client` in 2026 mode with a `sampling_callback` calls, through mcpmux (in process over
real HTTP, or `mcpmux serve` on stdio), tools of upstreams that sample during the call: in 2026 mode
(the upstream's own input-required rounds) and in legacy mode (pushed `sampling/createMessage`).

The upstream is this module run as a server (`python -m tests.e2e.test_sampling_forward`): its tools
sample once, twice in sequence, twice at once, or sample and then sleep.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.server.mcpserver import MCPServer, Resolve, Sample
from mcp.shared.exceptions import MCPError

from mcpmux import Mux
from mcpmux.server.frontend import Frontend
from tests.e2e.conftest import EVERYTHING, ROOT, everything_available, mux_over_stdio, served_in_process, text_of

# -- the upstream server (this module run with -m) ---------------------------------------------------

upstream = MCPServer("forward-demo")
cancelled: list[str] = []


def _ask(text: str) -> Sample:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))
    return Sample([message], max_tokens=16, system_prompt="Be brief.", temperature=0.0)


def _text(result: types.CreateMessageResult) -> str:
    return result.content.text if isinstance(result.content, types.TextContent) else ""


def first_request(prompt: str) -> Sample:
    return _ask(prompt)


def other_request(prompt: str) -> Sample:
    return _ask(f"{prompt} (other)")


def second_request(prompt: str, first: Annotated[types.CreateMessageResult, Resolve(first_request)]) -> Sample:
    return _ask(f"{prompt} after {_text(first)}")


@upstream.tool()
async def sample(prompt: str, result: Annotated[types.CreateMessageResult, Resolve(first_request)]) -> dict[str, Any]:
    """Sample once; return the text, model and stop reason."""
    return {"text": _text(result), "model": result.model, "stop_reason": result.stop_reason}


@upstream.tool()
async def twice(
    prompt: str,
    first: Annotated[types.CreateMessageResult, Resolve(first_request)],
    second: Annotated[types.CreateMessageResult, Resolve(second_request)],
) -> list[str]:
    """Sample, then sample again with the first answer in the prompt."""
    return [_text(first), _text(second)]


@upstream.tool()
async def both(
    prompt: str,
    first: Annotated[types.CreateMessageResult, Resolve(first_request)],
    other: Annotated[types.CreateMessageResult, Resolve(other_request)],
) -> list[str]:
    """Two independent samples (asked together where the protocol allows)."""
    return [_text(first), _text(other)]


@upstream.tool()
async def sample_then_sleep(
    prompt: str, seconds: float, result: Annotated[types.CreateMessageResult, Resolve(first_request)]
) -> str:
    """Sample, then sleep; a cancelled sleep is recorded."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        cancelled.append(prompt)
        raise
    return _text(result)


@upstream.tool()
def cancellations() -> list[str]:
    """The prompts of the sample_then_sleep calls that were cancelled."""
    return cancelled


# -- tests ---------------------------------------------------------------------------------------------

pytestmark = pytest.mark.anyio
PY = sys.executable
IDLE_TIMEOUT = 2.0  # seconds a parked call waits for the client's retry, here


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def server_table(name: str, protocol: str, policy: str) -> str:
    return (
        f'[servers.{name}]\ncommand = "{PY}"\nargs = ["-m", "tests.e2e.test_sampling_forward"]\n'
        f'cwd = "{ROOT}"\nprotocol = "{protocol}"\n[servers.{name}.sampling]\npolicy = "{policy}"\n'
    )


class RecordingClient:
    """A client-side model: answers each sampling request with its prompt, and remembers the requests."""

    def __init__(self) -> None:
        self.requests: list[types.CreateMessageRequestParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.requests.append(params)
        prompt = params.messages[-1].content
        text = prompt.text if isinstance(prompt, types.TextContent) else "?"
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=f"client says {text}"),
            model="client-llm",
            stop_reason="endTurn",
        )


class Served:
    """mcpmux in this process, over real HTTP on loopback, with its Mux and Frontend in reach."""

    def __init__(self, mux: Mux, frontend: Frontend, url: str) -> None:
        self.mux = mux
        self.frontend = frontend
        self.url = url


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    from tests.inference.tiny_models import build_tiny_model  # torch: only in the test process

    folder = tmp_path_factory.mktemp("forward")
    model = build_tiny_model("llama", folder / "llama")
    config = folder / "mcpmux.toml"
    config.write_text(
        "\n".join(
            [
                f'[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "{model}"\n'
                'kv_cache_memory_mb = 16\n[inference.embeddings]\nmodel = ""\n',
                server_table("modern", "auto", "client"),
                server_table("legacy", "legacy", "client"),
                server_table("either", "auto", "client-then-local"),
            ]
        )
    )
    async with served_in_process(config, _short_rounds) as (mux, frontend, url):
        yield Served(mux, frontend, url)


def _short_rounds(frontend: Frontend) -> None:
    frontend.rounds.idle_timeout = IDLE_TIMEOUT


@pytest.mark.parametrize("name", ["modern", "legacy"])
async def test_a_2026_client_answers_the_upstreams_sampling(served: Served, name: str) -> None:
    status = {s.name: s.protocol_version for s in served.mux.status()}
    assert status[name] == ("2026-07-28" if name == "modern" else "2025-11-25")
    model = RecordingClient()
    async with Client(served.url, mode="auto", sampling_callback=model) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool(f"{name}__sample", {"prompt": "Name a colour."})
    assert not result.is_error, text_of(result)
    assert result.structured_content == {
        "text": "client says Name a colour.",
        "model": "client-llm",
        "stop_reason": "endTurn",
    }
    assert [(r.system_prompt, r.max_tokens, r.temperature) for r in model.requests] == [("Be brief.", 16, 0.0)]
    assert served.frontend.rounds.parked == 0


@pytest.mark.parametrize("name", ["modern", "legacy"])
async def test_two_sampling_requests_in_one_call(served: Served, name: str) -> None:
    model = RecordingClient()
    async with Client(served.url, mode="auto", sampling_callback=model) as client:
        sequential = await client.call_tool(f"{name}__twice", {"prompt": "P"})
        together = await client.call_tool(f"{name}__both", {"prompt": "Q"})
    # The second request was built from the first answer: the rounds kept their order.
    assert sequential.structured_content == {"result": ["client says P", "client says P after client says P"]}
    assert together.structured_content == {"result": ["client says Q", "client says Q (other)"]}
    assert len(model.requests) == 4


def _answer(text: str) -> types.CreateMessageResult:
    return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text=text), model="m")


async def test_a_request_left_unanswered_is_asked_again(served: Served) -> None:
    """Two requests asked together (one round or two): answering one key per retry still completes the call.
    A 2026 upstream's rounds reach the client as the upstream wrote them: its own keys."""
    async with Client(served.url, mode="auto", sampling_callback=RecordingClient()) as client:
        arguments = {"prompt": "R"}
        result = await client.session.call_tool("modern__both", arguments, allow_input_required=True)
        asked: list[set[str]] = []
        while isinstance(result, types.InputRequiredResult):
            requests = result.input_requests or {}
            asked.append(set(requests))
            key = min(requests)  # answer one key only; any other must come back in a later round
            request = requests[key]
            assert isinstance(request, types.CreateMessageRequest)
            prompt = request.params.messages[0].content
            assert isinstance(prompt, types.TextContent)
            result = await client.session.call_tool(
                "modern__both",
                arguments,
                input_responses={key: _answer(f"answer to {prompt.text}")},
                request_state=result.request_state,
                allow_input_required=True,
            )
    assert result.structured_content == {"result": ["answer to R", "answer to R (other)"]}
    assert set().union(*asked) == {"__main__:first_request", "__main__:other_request"}
    assert len(asked) == 2


@pytest.mark.slow
async def test_rounds_on_the_wire_and_an_expired_or_unknown_request_state(served: Served) -> None:
    """Driven by hand: the round's request, then a retry after the parked call expired (after IDLE_TIMEOUT here)."""
    refused_before = served.mux.sampling.counts.refused
    async with Client(served.url, mode="auto", sampling_callback=RecordingClient()) as client:
        first = await client.session.call_tool("legacy__sample", {"prompt": "Hi"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        assert first.request_state is not None
        assert len(first.request_state) >= 32
        assert list(first.input_requests or {}) == ["sampling-1"]
        request = (first.input_requests or {})["sampling-1"]
        assert isinstance(request, types.CreateMessageRequest)
        assert request.params.messages[0].content == types.TextContent(type="text", text="Hi")

        # Same tool, other arguments: refused, the call stays parked.
        with pytest.raises(MCPError, match="retry the same tool with the same arguments"):
            await client.session.call_tool("legacy__sample", {"prompt": "Ho"}, request_state=first.request_state)
        await anyio.sleep(IDLE_TIMEOUT + 1.5)
        with pytest.raises(MCPError, match="requestState for tool 'legacy__sample' is unknown or expired"):
            await client.session.call_tool(
                "legacy__sample",
                {"prompt": "Hi"},
                input_responses={"sampling-1": _answer("late")},
                request_state=first.request_state,
            )
        with pytest.raises(MCPError, match=r"unknown or expired: .* call the tool again without requestState"):
            await client.session.call_tool("modern__sample", {"prompt": "Hi"}, request_state="mcpmux.made-up")
        # Any other state is a 2026 upstream's own round's: it goes back to that upstream, which judges it.
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await client.session.call_tool("modern__sample", {"prompt": "Hi"}, request_state="made-up")
    # The upstream was told its sampling request failed, and nothing stays parked.
    assert served.mux.sampling.counts.refused == refused_before + 1
    assert served.frontend.rounds.parked == 0


async def test_client_then_local_asks_a_2026_client_only_if_it_declared_sampling(served: Served) -> None:
    model = RecordingClient()
    async with Client(served.url, mode="auto", sampling_callback=model) as able:
        forwarded = await able.call_tool("either__sample", {"prompt": "Hi"})
    async with Client(served.url, mode="auto") as unable:
        local = await unable.call_tool("either__sample", {"prompt": "Hi"})
    assert forwarded.structured_content is not None
    assert local.structured_content is not None
    assert forwarded.structured_content["model"] == "client-llm"
    assert local.structured_content["model"] == "tiny"
    assert len(model.requests) == 1


@pytest.mark.slow
async def test_a_cancelled_call_cancels_the_upstream_call(served: Served) -> None:
    async with Client(served.url, mode="auto", sampling_callback=RecordingClient()) as client:
        # The client answers at once; the upstream then sleeps, and the client gives up on its retry.
        with anyio.move_on_after(3.0) as gave_up:
            await client.call_tool("modern__sample_then_sleep", {"prompt": "slow", "seconds": 30})
        assert gave_up.cancelled_caught
        with anyio.fail_after(10):
            while served.frontend.rounds.parked:
                await anyio.sleep(0.05)
        async with Client(served.url, mode="legacy") as observer:
            with anyio.fail_after(10):
                while (await observer.call_tool("modern__cancellations", {})).structured_content != {
                    "result": ["slow"]
                }:
                    await anyio.sleep(0.1)


@pytest.mark.slow
async def test_over_stdio_both_upstream_eras(tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        '[inference]\nbackend = "off"\n'
        + server_table("modern", "auto", "client")
        + server_table("legacy", "legacy", "client")
    )
    model = RecordingClient()
    async with mux_over_stdio(config, mode="auto", sampling_callback=model) as client:
        assert client.protocol_version == "2026-07-28"
        once = await client.call_tool("modern__sample", {"prompt": "A"})
        twice = await client.call_tool("legacy__twice", {"prompt": "B"})
    assert once.structured_content is not None
    assert once.structured_content["text"] == "client says A"
    assert twice.structured_content == {"result": ["client says B", "client says B after client says B"]}


@pytest.mark.slow
@pytest.mark.skipif(not everything_available(), reason="npm server-everything is not installed (make npm)")
async def test_server_everything_trigger_sampling_request(tmp_path: Path) -> None:
    config = tmp_path / "mcpmux.toml"
    config.write_text(
        '[inference]\nbackend = "off"\n'
        f'[servers.everything]\ncommand = "node"\nargs = ["{EVERYTHING}", "stdio"]\n'
        '[servers.everything.sampling]\npolicy = "client"\n'
    )
    model = RecordingClient()
    async with mux_over_stdio(config, mode="auto", sampling_callback=model) as client:
        result = await client.call_tool("everything__trigger-sampling-request", {"prompt": "Hello", "maxTokens": 9})
    assert not result.is_error, text_of(result)
    # server-everything puts its own words ahead of the prompt; the client's answer comes back whole.
    assert "client says Resource trigger-sampling-request context: Hello" in text_of(result)
    assert [r.max_tokens for r in model.requests] == [9]


if __name__ == "__main__":
    upstream.run("stdio")
