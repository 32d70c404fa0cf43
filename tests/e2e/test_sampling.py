"""Upstream servers that ask for sampling mid-call, answered by mcpmux in both protocol eras.

The upstreams are `examples/sampling_server.py` subprocesses: on a 2026-07-28 connection (`auto`)
the SDK asks through input-required rounds, on a 2025 one (`protocol = "legacy"`) it pushes
`sampling/createMessage`. Answers come from a tiny random model loaded by the Mux, from a real client
that declared sampling, or are refused under `policy = "off"`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError

from mcpmux import Mux
from mcpmux.errors import UpstreamError
from mcpmux.inference.engine.config import SamplingParams
from tests.e2e.conftest import PY, ROOT, everything_available, mux_over_http, text_of
from tests.inference.tiny_models import build_tiny_model

pytestmark = pytest.mark.anyio

SERVER = ROOT / "examples" / "sampling_server.py"
CAP = 6  # [servers.capped.sampling] max_tokens


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("sampling") / "llama")


def server_table(name: str, protocol: str = "auto", **sampling: Any) -> str:
    table = f'[servers.{name}]\ncommand = "{PY}"\nargs = ["{SERVER}"]\nprotocol = "{protocol}"\n'
    settings = "".join(f"{key} = {json.dumps(value)}\n" for key, value in sampling.items())
    return table + (f"[servers.{name}.sampling]\n{settings}" if settings else "")


def inference_table(model: Path | None, *names: str) -> str:
    if model is None:
        return '[inference]\nbackend = "off"\n'
    models = "".join(f'[inference.models.{name}]\nmodel = "{model}"\nkv_cache_memory_mb = 16\n' for name in names)
    return f'[inference]\nbackend = "local"\n{models}[inference.embeddings]\nmodel = ""\n'


def write_toml(path: Path, *tables: str) -> Path:
    path.write_text("\n".join(tables))
    return path


@pytest.fixture(scope="module")
async def mux(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mux]:
    """One Mux, two local models, five sampling upstreams (both eras, each policy that needs no client)."""
    config = write_toml(
        tmp_path_factory.mktemp("sampling_mux") / "mcpmux.toml",
        inference_table(tiny_model, "tiny", "mini"),
        server_table("modern", policy="local"),
        server_table("legacy", "legacy", policy="local"),
        server_table("capped", "legacy", policy="local", max_tokens=CAP, priority=5),
        server_table("fourth", policy="client-then-local"),
        server_table("closed", policy="off"),
    )
    async with Mux.from_config(config) as started:
        yield started


async def sample(mux: Mux, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await mux.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


async def local_text(mux: Mux, messages: list[dict[str, str]], max_tokens: int, model: str = "tiny") -> str:
    """The same request sent straight to the engine, for comparison."""
    assert mux.inference is not None
    completion = await mux.inference.complete(
        messages, SamplingParams(max_tokens=max_tokens, temperature=0), model=model
    )
    return completion.text


@pytest.mark.parametrize("upstream", ["modern", "legacy"])
async def test_answered_locally_through_the_chat_template(mux: Mux, upstream: str) -> None:
    status = {s.name: s.protocol_version for s in mux.status()}
    assert status[upstream] == ("2026-07-28" if upstream == "modern" else "2025-11-25")
    answer = await sample(mux, f"{upstream}__sample", prompt="Name a colour.", system="Be brief.", max_tokens=10)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    # temperature 0 in both: the bridge must build exactly the conversation the engine gets here.
    expected = await local_text(mux, messages, 10)
    answer_greedy = await sample(
        mux, f"{upstream}__sample", prompt="Name a colour.", system="Be brief.", max_tokens=10, temperature=0
    )
    assert answer_greedy == {"text": expected, "model": "tiny", "stop_reason": "maxTokens"}
    assert answer["model"] == "tiny"
    # Sampled from a random model over 384 tokens: about one draw in a hundred ends at once on an
    # end-of-turn token, with nothing to say; any other answer has text.
    assert answer["text"] or answer["stop_reason"] == "endTurn", answer


async def test_max_tokens_is_capped_and_stop_sequences_cut_the_text(mux: Mux) -> None:
    messages = [{"role": "user", "content": "Count."}]
    capped = await sample(mux, "capped__sample", prompt="Count.", max_tokens=200, temperature=0)
    assert capped == {"text": await local_text(mux, messages, CAP), "model": "tiny", "stop_reason": "maxTokens"}

    full = (await sample(mux, "legacy__sample", prompt="Count.", max_tokens=24, temperature=0))["text"]
    stop = full[8:11]
    cut = await sample(mux, "legacy__sample", prompt="Count.", max_tokens=24, temperature=0, stop=[stop, "\x7f\x7f"])
    assert cut == {"text": full[: full.index(stop)], "model": "tiny", "stop_reason": "stopSequence"}


async def test_model_hints_pick_a_configured_model(mux: Mux) -> None:
    assert (await sample(mux, "modern__sample", prompt="Hi", max_tokens=2))["model"] == "tiny"
    assert (await sample(mux, "modern__sample", prompt="Hi", max_tokens=2, model_hint="MIN"))["model"] == "mini"
    # No configured model matches: the default answers.
    assert (await sample(mux, "modern__sample", prompt="Hi", max_tokens=2, model_hint="gpt-9"))["model"] == "tiny"


async def test_seed_in_metadata_makes_sampling_reproducible(mux: Mux) -> None:
    texts = [
        (await sample(mux, "modern__sample", prompt="Go", max_tokens=12, temperature=1.0, seed=seed))["text"]
        for seed in (7, 7, 8)
    ]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


@pytest.mark.parametrize("upstream", ["modern", "legacy"])
async def test_images_are_refused_by_name(mux: Mux, upstream: str) -> None:
    with pytest.raises(UpstreamError, match="image content in sampling message 0, which local model 'tiny'"):
        await mux.call_tool(f"{upstream}__sample", {"prompt": "What is this?", "with_image": True})


async def test_policy_off_refuses_with_the_setting_to_change(mux: Mux) -> None:
    with pytest.raises(UpstreamError, match=r"sampling policy is 'off'; set \[servers.closed.sampling\] policy"):
        await mux.call_tool("closed__sample", {"prompt": "Hi"})
    assert mux.sampling.counts.refused >= 1


async def test_32_concurrent_requests_from_4_upstreams_share_engine_steps(mux: Mux) -> None:
    assert mux.inference is not None
    before = mux.inference.stats()["models"]["tiny"]
    results: list[dict[str, Any]] = []

    async def one(upstream: str, i: int) -> None:  # distinct prompts: identical greedy ones would share one request
        results.append(
            await sample(
                mux, f"{upstream}__sample", prompt=f"Request {i} from {upstream}", max_tokens=CAP, temperature=0
            )
        )

    async with anyio.create_task_group() as tasks:
        for upstream in ("modern", "legacy", "capped", "fourth"):
            for i in range(8):
                tasks.start_soon(one, upstream, i)
    after = mux.inference.stats()["models"]["tiny"]
    assert len(results) == 32
    assert all(r["model"] == "tiny" for r in results)
    assert after["requests_finished"] - before["requests_finished"] == 32
    generated = after["generated_tokens"] - before["generated_tokens"]
    steps = after["steps"] - before["steps"]
    # One request alone needs one step per token; sharing the running batch needs far fewer.
    assert all(r["stop_reason"] == "maxTokens" for r in results)
    assert generated == 32 * CAP
    assert steps < generated / 2, f"{steps} steps for {generated} tokens: requests did not share steps"


async def test_without_inference_a_local_policy_says_how_to_turn_it_on(tmp_path: Path) -> None:
    config = write_toml(tmp_path / "mcpmux.toml", inference_table(None), server_table("s", policy="local"))
    async with Mux.from_config(config) as mux:
        with pytest.raises(UpstreamError, match=r'local inference is off; set \[inference\] backend = "local"'):
            await mux.call_tool("s__sample", {"prompt": "Hi"})


class RecordingClient:
    """A client-side model: answers sampling requests and remembers them."""

    def __init__(self) -> None:
        self.requests: list[types.CreateMessageRequestParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.requests.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="answer from the client"),
            model="client-llm",
            stop_reason="endTurn",
        )


async def test_forwarded_to_the_calling_client_when_it_can_sample(tmp_path: Path) -> None:
    """One mcpmux over HTTP, three clients: those that declared sampling are asked, in either era."""
    config = write_toml(
        tmp_path / "mcpmux.toml",
        inference_table(None),
        server_table("modern", policy="client"),
        server_table("legacy", "legacy", policy="client"),
    )
    able, modern_client = RecordingClient(), RecordingClient()
    with mux_over_http(config) as url:
        async with Client(url, mode="legacy", sampling_callback=able) as client:
            for upstream in ("modern", "legacy"):
                arguments = {"prompt": f"Hello {upstream}?", "system": "Be kind.", "max_tokens": 7}
                result = await client.call_tool(f"{upstream}__sample", arguments)
                assert result.structured_content == {
                    "text": "answer from the client",
                    "model": "client-llm",
                    "stop_reason": "endTurn",
                }
        # A 2026-07-28 client is asked through input-required rounds (see test_sampling_forward.py);
        # a 2025 client that did not declare sampling is never asked.
        async with Client(url, mode="auto", sampling_callback=modern_client) as client:
            result = await client.call_tool("modern__sample", {"prompt": "Hi"})
            assert result.structured_content is not None
            assert result.structured_content["model"] == "client-llm"
        async with Client(url, mode="legacy") as client:
            with pytest.raises(MCPError, match=r'policy = "client-then-local" to fall back to the local model'):
                await client.call_tool("legacy__sample", {"prompt": "Hi"})
    assert [r.messages[0].content for r in able.requests] == [
        types.TextContent(type="text", text="Hello modern?"),
        types.TextContent(type="text", text="Hello legacy?"),
    ]
    assert {(r.system_prompt, r.max_tokens) for r in able.requests} == {("Be kind.", 7)}
    assert len(modern_client.requests) == 1


async def test_upstream_priority_orders_requests_in_the_engine(tmp_path: Path, tiny_model: Path) -> None:
    """One sequence at a time: a high-priority upstream's request overtakes those already waiting."""
    config = write_toml(
        tmp_path / "mcpmux.toml",
        f'[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "{tiny_model}"\n'
        'kv_cache_memory_mb = 16\nmax_num_seqs = 1\n[inference.embeddings]\nmodel = ""\n',
        server_table("low", "legacy", policy="local", priority=0),
        server_table("high", "legacy", policy="local", priority=10),
    )
    finished: list[str] = []

    async def call(upstream: str, i: int) -> None:
        # Each low runs long enough (256 tokens) for the high's trip through its upstream to end
        # within it, on a loaded machine too.
        tokens = 256 if upstream == "low" else 64
        await sample(started, f"{upstream}__sample", prompt=f"Request {i}", max_tokens=tokens, temperature=0)
        finished.append(f"{upstream}{i}")

    async with Mux.from_config(config) as started, anyio.create_task_group() as tasks:
        assert started.inference is not None
        for i in range(4):
            tasks.start_soon(call, "low", i)
        with anyio.fail_after(30):
            while started.inference.stats()["models"]["tiny"]["waiting"] < 3:
                await anyio.sleep(0.005)
        tasks.start_soon(call, "high", 0)
    # The high request is admitted ahead of the three lows waiting when it arrived (allowing, on a
    # loaded machine, one more low to finish while it travels through its upstream to the engine).
    assert finished.index("high0") <= 2, finished


@pytest.mark.slow
async def test_the_example_config_answers_sampling_with_smollm2(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run`'s config: the SDK example server and server-everything answered by the real SmolLM2."""
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root
    question = "What is the capital of France? Answer in one sentence."
    async with Mux.from_config("examples/mcpmux.toml") as mux:
        answer = await sample(mux, "summarizer__sample", prompt=question, max_tokens=40, temperature=0)
        assert answer["model"] == "smollm2"
        assert answer["stop_reason"] == "endTurn"
        assert "Paris" in answer["text"]
        if everything_available():
            result = await mux.call_tool("everything__trigger-sampling-request", {"prompt": question, "maxTokens": 40})
            assert not result.is_error, text_of(result)
            assert '"model": "smollm2"' in text_of(result)
            # server-everything sends no temperature, so the model samples at 1.0: any answer is its own.
            assert '"stopReason": "' in text_of(result)
