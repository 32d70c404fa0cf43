"""Batching tests run on anyio's pytest plugin, asyncio backend, on virtual time.

The batching layer reads only the event loop's clock (see `mcpmux.batching`), so on a
`VirtualTimeLoop` every sleep, delay, rate and deadline in these tests takes no real time and the
times they assert are exact, whatever else the machine is doing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.batching.virtual_time import VIRTUAL_TIME_BACKEND


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """Every `@pytest.mark.anyio` test in this directory runs on asyncio with a `VirtualTimeLoop`."""
    return VIRTUAL_TIME_BACKEND
