"""Batching tests run on anyio's pytest plugin, asyncio backend."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Every `@pytest.mark.anyio` test in this directory runs on asyncio."""
    return "asyncio"
