"""The library entry point as the README shows it, on the example config `make run` serves."""

from __future__ import annotations

import json

import pytest

from mcpmux import Mux
from tests.e2e.conftest import ROOT, everything_available, text_of

pytestmark = pytest.mark.anyio


async def test_readme_library_example_on_the_example_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root, as `make run` uses them
    async with Mux.from_config("examples/mcpmux.toml") as mux:
        result = await mux.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert json.loads(text_of(result))["timezone"] == "UTC"
        status = {s.name: s for s in mux.status()}
        assert status["time"].state.value == "ready"
        assert "remote" not in status  # disabled in the example
        names = {tool.name for tool in mux.list_tools()}
        if everything_available():
            assert status["everything"].state.value == "ready"
            assert "everything__echo" in names
            assert "everything__get-env" not in names  # denied in the example
