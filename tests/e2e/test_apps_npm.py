"""MCP Apps through mcpmux with the reference servers from npm (`@modelcontextprotocol/server-pdf`
2.0.4, `server-basic-vanillajs` 2.0.3), as an MCP Apps host sees them, directly and through
mcpmux's stdio and HTTP fronts: the views' metadata and bytes, the model's call that opens a view,
the view's own calls by its server's tool names (the PDF viewer's `poll_pdf_commands` and
`read_pdf_bytes`, the basic app's `get-time`), and no server left running once the host is gone
(server-pdf outlives its stdin closing by a minute)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.conftest import PY, ROOT, mux_over_http, mux_over_stdio, text_of

NPM = ROOT / ".npm" / "node_modules" / "@modelcontextprotocol"
PDF_SERVER = NPM / "server-pdf" / "dist" / "index.js"
BASIC_SERVER = NPM / "server-basic-vanillajs" / "dist" / "index.js"
TS_SDK = NPM / "sdk"
HOST = ROOT / "tests" / "e2e" / "apps_host.mjs"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,  # node servers and a node host: ~10 s a run
    pytest.mark.skipif(
        not (PDF_SERVER.exists() and BASIC_SERVER.exists() and TS_SDK.exists()) or shutil.which("node") is None,
        reason="the npm MCP Apps servers are not installed (make setup)",
    ),
]


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF that says `text`, its cross-reference table exact."""
    stream = f"BT /F1 24 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _servers(pdf: Path) -> dict[str, dict[str, Any]]:
    return {
        "pdf": {"command": "node", "args": [str(PDF_SERVER), "--stdio", str(pdf)]},
        "basic": {"command": "node", "args": [str(BASIC_SERVER), "--stdio"]},
    }


def _config(folder: Path, pdf: Path) -> Path:
    path = folder / "mcpmux.json"
    path.write_text(json.dumps({"mcpServers": _servers(pdf), "inference": {"backend": "off"}}))
    return path


def _plan(pdf: Path, prefix: str) -> dict[str, Any]:
    """The model opens the PDF and asks the viewer to go to page 1; the view polls for that command,
    reads the PDF's bytes, and the basic app's view asks for the time: by the names their HTML uses."""
    view = {"$shown": "viewUUID"}
    return {
        "declare": True,
        "show": {"name": f"{prefix}display_pdf", "arguments": {"url": str(pdf)}},
        "model_calls": [
            {"name": f"{prefix}interact", "arguments": {"viewUUID": view, "action": "navigate", "page": 1}}
        ],
        "view_calls": [
            {"name": "poll_pdf_commands", "arguments": {"viewUUID": view}},
            {"name": "read_pdf_bytes", "arguments": {"url": str(pdf), "offset": 0, "byteCount": 65536}},
        ],
    }


async def _host(plan: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "MCP_SDK_DIR": str(TS_SDK)}
    with anyio.fail_after(90):
        done = await anyio.run_process(["node", str(HOST), json.dumps(plan)], env=env)
    answers: dict[str, Any] = json.loads(done.stdout)
    return answers


def _left_running(marker: str, within: float) -> list[str]:
    """Command lines of processes that name `marker` after `within` seconds (none: they ended)."""
    deadline = time.monotonic() + within
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                line = cmdline.read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # ended while read
            if marker in line:
                found.append(line)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _views(answers: dict[str, Any], prefix: str) -> dict[str, Any]:
    """What a host keeps of the tools and resources: each tool's `_meta`, each resource's listing."""
    tools = {tool["name"].removeprefix(prefix): tool.get("_meta") for tool in answers["tools"]}
    return {"tools": {name: meta for name, meta in tools.items() if not name.startswith("mux_")}}


def _plain(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results as a client reads them: mcpmux writes out `isError: false`, which the SDK's models default to."""
    return [{key: value for key, value in result.items() if (key, value) != ("isError", False)} for result in results]


@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_the_pdf_viewer_works_through_mcpmux_as_it_does_directly(tmp_path: Path, front: str) -> None:
    pdf = tmp_path / f"doc-{front}.pdf"
    pdf.write_bytes(minimal_pdf("hello from mcpmux"))
    servers = _servers(pdf)
    direct_pdf = await _host({**_plan(pdf, ""), "connect": servers["pdf"]})
    direct_basic = await _host({"declare": True, "connect": servers["basic"], "show": {"name": "get-time"}})
    assert _left_running(str(pdf), within=1.0) == []
    plan = {**_plan(pdf, "pdf__"), "view_calls": [*_plan(pdf, "")["view_calls"], {"name": "get-time", "arguments": {}}]}
    config = _config(tmp_path, pdf)
    if front == "stdio":
        mux_command = {"command": PY, "args": ["-m", "mcpmux", "serve", "--config", str(config)]}
        through = await _host({**plan, "connect": mux_command})
        # The host closed mcpmux's stdin and sent SIGTERM 2 s later: server-pdf, which ignores its
        # stdin closing, was still running then, and must not outlive mcpmux.
        assert _left_running(str(pdf), within=1.0) == []
    else:
        with mux_over_http(config) as url:
            through = await _host({**plan, "connect": {"url": url}})
        assert _left_running(str(pdf), within=1.0) == []

    # Every tool and its view as directly, names prefixed and ui:// URIs named after their server.
    pdf_tools = {f"pdf__{name}": meta for name, meta in _views(direct_pdf, "")["tools"].items()}
    basic_tools = {f"basic__{name}": meta for name, meta in _views(direct_basic, "")["tools"].items()}
    named = {
        name: json.loads(json.dumps(meta).replace('"ui://', f'"ui://{name.split("__")[0]}+'))
        for name, meta in {**pdf_tools, **basic_tools}.items()
    }
    assert _views(through, "")["tools"] == named
    expected = [
        {**r, "uri": r["uri"].replace("ui://", f"ui://{server}+")}
        for server, answers in (("pdf", direct_pdf), ("basic", direct_basic))
        for r in answers["resources"]
    ]
    assert through["resources"] == expected
    # The view the host renders: the same bytes, MIME profile and CSP/permissions metadata.
    [direct_view], [through_view] = direct_pdf["view"]["contents"], through["view"]["contents"]
    assert through_view == {**direct_view, "uri": "ui://pdf+pdf-viewer/mcp-app.html"}
    assert through_view["mimeType"] == "text/html;profile=mcp-app"
    # The model's call opened a viewer, and the view's own calls by bare names reached their servers.
    assert through["shown"]["structuredContent"]["url"] == str(pdf)
    assert _plain(through["model_calls"]) == _plain(direct_pdf["model_calls"])
    polled, read, time_ = through["view_calls"]
    assert polled["structuredContent"] == {"commands": [{"type": "navigate", "page": 1}]}
    assert _plain([polled]) == _plain(direct_pdf["view_calls"][:1])
    assert base64.b64decode(read["structuredContent"]["bytes"]) == pdf.read_bytes()
    assert _plain([read]) == _plain(direct_pdf["view_calls"][1:2])
    assert "time" in time_["structuredContent"]


async def test_a_python_client_of_either_era_reads_and_calls_the_views_through_mcpmux(tmp_path: Path) -> None:
    pdf = tmp_path / "doc-python.pdf"
    pdf.write_bytes(minimal_pdf("python"))
    config = _config(tmp_path, pdf)
    for mode in ("legacy", "auto"):
        async with mux_over_stdio(config, mode=mode) as client:
            tools = {tool.name: tool.meta for tool in (await client.list_tools()).tools}
            view = tools["basic__get-time"]["ui"]["resourceUri"]  # type: ignore[index]
            [page] = (await client.read_resource(view)).contents
            shown = await client.call_tool("basic__get-time", {})
            own = await client.call_tool("get-time", {})  # the view's call, by its server's name
            read = await client.call_tool("read_pdf_bytes", {"url": str(pdf), "offset": 0, "byteCount": 4096})
        assert view == "ui://basic+get-time/mcp-app.html"
        assert (page.uri, page.mime_type) == (view, "text/html;profile=mcp-app")
        assert "<html" in getattr(page, "text", "")
        assert not shown.is_error
        assert not own.is_error
        assert text_of(own) >= text_of(shown)  # ISO 8601 times: the view's call came second
        assert base64.b64decode((read.structured_content or {})["bytes"]) == pdf.read_bytes()
    assert _left_running(str(pdf), within=5.0) == []
