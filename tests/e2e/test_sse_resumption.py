"""A call whose event stream the upstream ends before the answer is resumed (SEP-1699), on every
upstream HTTP path: the raw lane (`fast_path = true`) and the SDK's client (`fast_path = false`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import mux_over_stdio, text_of, write_config
from tests.e2e.test_http_lane import ERAS, raw_http_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RETRY_MS = 300  # what tests/servers/raw_http_server.py's broken streams name in `retry`


@pytest.mark.parametrize("fast_path", [True, False], ids=["lane", "sdk"])
@pytest.mark.parametrize("era", ERAS)
async def test_a_broken_off_stream_is_resumed_after_retry_with_its_last_event_id(
    tmp_path: Path, era: str, fast_path: bool
) -> None:
    """Each call's answer comes on the GET that resumes its stream, sent once `retry` has passed and
    naming the stream's last event id; no call is sent twice (the upstream ran each once)."""
    with raw_http_server("sse-break") as url:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": url, "protocol": era}}, fast_path=fast_path)
        async with mux_over_stdio(config) as client:
            seen = []
            for _ in range(3):
                result = await client.call_tool("raw__whoami", {})
                assert not result.is_error, text_of(result)
                seen.append(json.loads(text_of(result)))
    ids = [call["id"] for call in seen]
    assert seen[-1]["ran"] == {"whoami": 3}
    resumed = seen[-1]["resumed"]  # the reconnections of the calls before the last
    assert [entry["last_event_id"] for entry in resumed] == [f"{call_id}-1" for call_id in ids[:2]]
    assert all(entry["after_ms"] >= RETRY_MS - 20 for entry in resumed), resumed
