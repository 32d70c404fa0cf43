"""An upstream's `subscriptions/listen` answer never holds back its readiness (2026-07-28)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.conftest import mux_over_stdio, write_config
from tests.e2e.test_http_lane import raw_http_server, whoami

pytestmark = pytest.mark.anyio


async def test_an_upstream_that_never_finishes_its_listen_answer_is_served_at_once(tmp_path: Path) -> None:
    """As the suite's 2026 reference server: the acknowledgement in an `application/json` body left open.

    Before, mcpmux waited on that body for ever: the upstream never listed anything, and its calls
    were "unknown tool" until `startup_timeout` (here 20 s) gave up on it.
    """
    with raw_http_server("listen-json") as url:
        config = write_config(tmp_path / "mux.json", {"raw": {"url": url}}, startup_timeout=20)
        started = time.monotonic()
        async with mux_over_stdio(config) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert time.monotonic() - started < 15  # the listen was given up on well before startup_timeout
            assert "raw__whoami" in names
            await whoami(client)
            await whoami(client)
