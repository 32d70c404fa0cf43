"""An upstream that puts several JSON-RPC messages in one `application/json` body (a progress
notification, then the response), as the MCP conformance suite's reference server does, is read
message by message on every upstream HTTP path: the raw lane (`fast_path = true`) and the SDK's
client (`fast_path = false`). Its client hears the progress and gets the result; the deviation is
logged once for the upstream (mcpmux.upstream.json_bodies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from tests.e2e.conftest import served_in_process, text_of, write_config
from tests.e2e.test_http_lane import raw_http_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DEVIATION = "JSON-RPC messages in one application/json body"


@pytest.mark.parametrize("fast_path", [True, False], ids=["lane", "sdk"])
@pytest.mark.parametrize(
    ("era", "shape"),
    [("auto", "joined"), ("legacy", "joined"), ("legacy", "joined-array")],
    ids=["2026-lines", "2025-lines", "2025-array"],
)
async def test_a_json_body_holding_a_notification_and_the_answer_is_read_message_by_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, era: str, shape: str, fast_path: bool
) -> None:
    with raw_http_server(shape) as url:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": url, "protocol": era}}, fast_path=fast_path)
        async with served_in_process(config) as (_, _, front), Client(front) as client:
            steps: list[tuple[float, float | None, str | None]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                steps.append((progress, total, message))

            for call in range(1, 3):
                result = await client.call_tool("raw__whoami", {}, progress_callback=on_progress)
                assert not result.is_error, text_of(result)
                seen = json.loads(text_of(result))
                assert (seen["encoding"] is None) == fast_path  # the lane asks for no compression; the SDK does
                assert steps == [(1, 2, "half way")] * call
            # Asked for no progress, the body holds the answer alone (an array of one in the array shape).
            alone = await client.call_tool("raw__whoami", {})
            assert json.loads(text_of(alone))["ran"] == {"whoami": 3}
    warned = [record.getMessage() for record in caplog.records if DEVIATION in record.getMessage()]
    assert len(warned) == 1, warned
    assert "upstream 'raw'" in warned[0]
