"""A 2025 client is asked by an upstream that speaks both eras as it would be asked directly.

mcpmux (in process, over real HTTP on loopback) fronts `tests/servers/eras_server.py`, a real
upstream run as a subprocess that speaks both eras and asks its client (sampling, elicitation)
only on its 2025 path, as the conformance suite's reference server does. mcpmux's shared session
with it speaks 2026-07-28 (`protocol = "auto"`); real `mcp.Client`s call through mcpmux: a 2025
client that can be asked is served by a 2025 session, and is asked; a 2026 client, and a 2025
client that declared nothing to ask, stay on the 2026-07-28 session. A server that speaks
2026-07-28 only is covered by `test_relayed_rounds.py` (its 2025 clients get its rounds as requests).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from tests.e2e.conftest import ROOT, served_in_process, text_of, write_config
from tests.servers import eras_server

pytestmark = pytest.mark.anyio
SERVER = ROOT / "tests" / "servers" / "eras_server.py"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    folder = tmp_path_factory.mktemp("eras")
    # Sampling by the calling client only: mcpmux's own model is not what is tested here.
    eras = {"command": sys.executable, "args": [str(SERVER)], "sampling": {"policy": "client"}}
    config = write_config(folder / "mcpmux.json", {"eras": eras})
    async with served_in_process(config) as (mux, _, served):
        assert mux.upstreams["eras"].status().protocol_version == "2026-07-28"  # the shared session speaks 2026
        yield served


async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    asked = params.messages[0].content
    text = asked.text if isinstance(asked, types.TextContent) else "?"
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"{text}, answered"), model="m"
    )


async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    assert isinstance(params, types.ElicitRequestFormParams)
    assert params.requested_schema == eras_server.FORM
    return types.ElicitResult(action="accept", content={"name": "Ada"})


async def test_a_2025_client_is_asked_by_a_dual_era_upstream_on_its_2025_path(url: str) -> None:
    async with Client(url, mode="legacy", sampling_callback=sample, elicitation_callback=elicit) as client:
        assert client.protocol_version == "2025-11-25"
        era = await client.call_tool("eras__era", {})
        sampled = await client.call_tool("eras__sample", {})
        confirmed = await client.call_tool("eras__confirm", {})
    assert text_of(era) == "2025-11-25"
    assert not sampled.is_error, text_of(sampled)
    assert text_of(sampled) == "LLM said: Test prompt, answered"
    assert not confirmed.is_error, text_of(confirmed)
    assert text_of(confirmed) == 'accept: {"name": "Ada"}'


async def test_a_2026_client_stays_on_the_2026_path(url: str) -> None:
    async with Client(url, sampling_callback=sample, elicitation_callback=elicit) as client:
        assert client.protocol_version == "2026-07-28"
        era = await client.call_tool("eras__era", {})
        sampled = await client.call_tool("eras__sample", {})
    assert text_of(era) == "2026-07-28"
    assert sampled.is_error
    assert text_of(sampled) == "sample asks its client only on a 2025 session"


async def test_a_2025_client_that_cannot_be_asked_shares_the_2026_session(url: str) -> None:
    async with Client(url, mode="legacy") as client:
        era = await client.call_tool("eras__era", {})
    assert text_of(era) == "2026-07-28"
