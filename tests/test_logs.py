"""Structured logs: JSON lines that parse, and a request id that ties a client call to its upstream call."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcpmux import Mux
from mcpmux.core.config import config_from_dict
from mcpmux.core.logs import RequestContext, configure_logging, current_request
from tests.e2e.conftest import PY, demo, text_of, write_config


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging replaces the root handlers (pytest's own among them): put them back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def lines_of(records: list[dict[str, Any]], request_id: str) -> list[str]:
    return [r["msg"] for r in records if r.get("request_id") == request_id]


@pytest.mark.slow
def test_cli_json_logs_tie_the_client_call_to_its_upstream_call(tmp_path: Path) -> None:
    config = write_config(tmp_path / "mcp.json", {"alpha": demo("alpha")})
    command = [PY, "-m", "mcpmux", "--log-format", "json", "--log-level", "debug", "call", "--config", str(config)]
    done = subprocess.run([*command, "alpha__echo", '{"text": "hi"}'], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["content"][0]["text"] == "alpha: hi"
    # The upstream child shares mcpmux's stderr and writes its own format; mcpmux's lines are the JSON ones.
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert records
    assert all({"ts", "level", "logger", "msg"} <= record.keys() for record in records)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"]) for record in records)
    started = [r for r in records if r["msg"] == "client call started: alpha__echo"]
    assert len(started) == 1
    request_id = started[0]["request_id"]
    assert re.fullmatch(r"[0-9a-f]{8}", request_id)
    tied = [r for r in records if r.get("request_id") == request_id]
    assert [r["msg"] for r in tied if r["logger"] in ("mcpmux.mux.multiplexer", "mcpmux.mux.dispatcher")] == [
        "client call started: alpha__echo",
        "upstream call sent: echo",
        "upstream call answered: echo",
        tied[-1]["msg"],
    ]
    assert tied[-1]["msg"].startswith("client call ended: alpha__echo, ok in ")
    assert {(r["upstream"], r["tool"]) for r in tied if r["logger"] == "mcpmux.mux.dispatcher"} == {
        ("alpha", "alpha__echo")
    }


@pytest.mark.anyio
async def test_concurrent_calls_get_their_own_request_ids(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("debug", "json")
    async with Mux(config_from_dict({"servers": {"alpha": demo("alpha")}}, source="test")) as mux:
        capsys.readouterr()
        answers: dict[str, str] = {}

        async def call(text: str) -> None:
            answers[text] = text_of(await mux.call_tool("alpha__echo", {"text": text}))

        async with anyio.create_task_group() as calls:
            for text in ("one", "two", "three"):
                calls.start_soon(call, text)
    assert answers == {text: f"alpha: {text}" for text in ("one", "two", "three")}
    records = json_lines(capsys.readouterr().err)  # every line of the in-process loggers is JSON
    ids = {r["request_id"] for r in records if r["msg"] == "client call started: alpha__echo"}
    assert len(ids) == 3
    for request_id in ids:
        ours = [m for m in lines_of(records, request_id) if "call" in m]
        assert ours[:1] == ["client call started: alpha__echo"]
        assert ours.count("upstream call sent: echo") == 1
        assert ours.count("upstream call answered: echo") == 1
        assert ours[-1].startswith("client call ended: alpha__echo, ok")


def test_text_lines_carry_the_request_context(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "text")
    log = logging.getLogger("mcpmux.test")
    with RequestContext(tool="alpha__echo", upstream="alpha") as info:
        log.info("inside")
    log.info("outside")
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(f"INFO mcpmux.test: [req={info.request_id} upstream=alpha tool=alpha__echo] inside")
    assert err[1].endswith("INFO mcpmux.test: outside")


def test_json_lines_carry_extras_and_exceptions(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", "json")
    configure_logging("warning", "json")  # configuring twice must not double the lines
    log = logging.getLogger("mcpmux.test")
    log.info("below the level")
    try:
        raise ValueError("broken pipe to upstream")
    except ValueError:
        log.exception("upstream %s failed", "alpha", extra={"attempt": 2, "path": Path("/x")})
    (record,) = json_lines(capsys.readouterr().err)
    assert record["level"] == "error"
    assert record["msg"] == "upstream alpha failed"
    assert record["attempt"] == 2
    assert record["path"] == repr(Path("/x"))
    assert "ValueError: broken pipe to upstream" in record["exc"]
    assert "request_id" not in record  # no call in progress


def test_nested_calls_share_the_outer_request_id() -> None:
    assert current_request() is None
    with RequestContext(tool="parallel") as outer:
        with RequestContext(tool="alpha__echo", upstream="alpha") as inner:
            assert inner.request_id == outer.request_id
            assert current_request() is inner
        assert current_request() is outer
    assert current_request() is None
    with RequestContext(tool="parallel") as other:
        assert other.request_id != outer.request_id
