"""The library entry point as the README shows it, on the example config `make run` serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcpmux import Mux
from tests.e2e.conftest import ROOT, demo, everything_available, text_of, write_config

pytestmark = pytest.mark.anyio


async def test_readme_library_example_on_the_example_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the README's path; the example's own paths are relative to its folder
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


async def test_an_error_raised_in_the_body_reaches_the_caller_unwrapped(tmp_path: Path) -> None:
    """`except KeyError` around `async with Mux...` catches a KeyError raised inside, not an ExceptionGroup."""
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")})
    with pytest.raises(KeyError, match="not-a-tool"):
        async with Mux.from_config(config) as mux:
            {tool.name: tool for tool in mux.list_tools()}["not-a-tool"]
