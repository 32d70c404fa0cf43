"""The dashboard at `/` of `mcpmux serve --transport http`, in a real headless Chromium and over plain HTTP.

The browser tests need Debian's `chromium` (`make test` installs it where apt can run); where it
is absent they are skipped with that reason. Everything else runs anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from tests.e2e.browser import Browser, chromium_available
from tests.e2e.conftest import DEMO, PY, demo, free_port, stop, text_of, wait_for_port
from tests.inference.tiny_models import build_tiny_model

needs_chromium = pytest.mark.skipif(
    not chromium_available(),
    reason="no chromium at /usr/bin/chromium: `make browser` installs Debian's (as root, where apt-get runs)",
)
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}


@contextmanager
def served(config: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """`mcpmux serve --transport http` on a free port; yields its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [PY, "-m", "mcpmux", "serve", "--config", str(config), "--transport", "http", "--port", str(port)],
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    try:
        wait_for_port(port, process, timeout=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def flaky_upstream(folder: Path) -> tuple[dict[str, object], Path]:
    """A demo server that starts only while its flag file exists: once the flag is gone and it is
    crashed, every restart fails, with a reason on stderr and exit status 4."""
    flag = folder / "beta.may-start"
    flag.touch()
    script = folder / "beta.sh"
    script.write_text(
        f'#!/bin/sh\n[ -f "{flag}" ] || {{ echo "beta: the flag file is gone; refusing to start" >&2; exit 4; }}\n'
        f'exec "{PY}" "{DEMO}" beta\n'
    )
    script.chmod(0o755)
    return {"command": str(script)}, flag


@pytest.mark.slow
@needs_chromium
@pytest.mark.anyio
async def test_the_dashboard_renders_and_follows_an_upstream_going_down(tmp_path: Path) -> None:
    beta, flag = flaky_upstream(tmp_path)
    model = build_tiny_model("llama", tmp_path / "tiny")
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {"alpha": demo("alpha"), "beta": beta},
                "profiles": {"ops": {"servers": ["alpha"]}},
                "mux": {"restart_initial_backoff": 5.0},
                "inference": {"models": {"tiny": {"model": str(model), "kv_cache_memory_mb": 16}}},
            }
        )
    )
    with served(config) as base, Browser() as page:
        page.send("Emulation.setDeviceMetricsOverride", PHONE)
        page.goto(f"{base}/")
        page.wait_for("document.querySelector('[data-upstream=\"beta\"]')?.dataset.state === 'ready'", 120)
        async with Client(f"{base}/mcp") as client:
            for word in ("a", "b", "c"):
                assert text_of(await client.call_tool("alpha__echo", {"text": word})) == f"alpha: {word}"
            generated = await client.call_tool("local__generate", {"prompt": "Hi", "max_tokens": 4})
            assert not generated.is_error, text_of(generated)
            # beta's process dies, and its restarts are refused.
            flag.unlink()
            crashed = await client.call_tool("beta__crash", {})
            assert crashed.is_error  # "lost its connection": the call died with the process
        calls = page.wait_for(
            "document.querySelector('[data-tool=\"alpha/echo\"] td:nth-child(2)')?.textContent === '3'", 30
        )
        assert calls
        page.wait_for("document.querySelector('[data-upstream=\"beta\"]')?.dataset.state === 'down'", 60)
        # Down first with the crash's reason ("exited with status 3"), then, the restart refused at once, with
        # the restart's: the page follows it (reading the reason as soon as it showed "down" raced the restart).
        error_of_beta = "document.querySelector('[data-error-of=\"beta\"]')?.textContent"
        reason = page.wait_for(f"({error_of_beta} || '').includes('exited with status 4') && {error_of_beta}", 30)
        assert "exited with status 4" in reason
        assert "the flag file is gone; refusing to start" in reason
        page.wait_for("!!document.querySelector('[data-model=\"tiny\"]')", 30)
        text = page.evaluate("document.body.innerText")
        for words in ("Upstreams", "Calls per tool", "Sessions", "ops", "Inference engine", "Tool search", "BM25"):
            assert words in text, words
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), "wider than a phone"
        assert page.evaluate("document.querySelector('#live').textContent").startswith("live")
    assert page.errors == []


@needs_chromium
def test_the_dashboard_asks_for_the_token_the_server_wants(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    token = "dashboard-test-token-123"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {"alpha": demo("alpha")},
                "http": {"auth_token_env": "MCPMUX_DASHBOARD_TEST_TOKEN"},
                "inference": {"backend": "off"},
            }
        )
    )
    with served(config, {"MCPMUX_DASHBOARD_TEST_TOKEN": token}) as base, Browser() as page:
        page.goto(f"{base}/")
        page.wait_for("!!document.querySelector('input[type=password]')")
        page.evaluate(
            f"document.querySelector('input').value = {json.dumps(token)};"
            "document.querySelector('form').requestSubmit(); true"
        )
        page.wait_for("document.querySelector('[data-upstream=\"alpha\"]')?.dataset.state === 'ready'", 60)
    # The one refused fetch is the page's own first try, before it had a token.
    assert [error for error in page.errors if "401" not in error] == []


def test_the_page_needs_no_token_its_state_needs_an_http_one(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {"alpha": demo("alpha")},
                "http": {"auth_token_env": "MCPMUX_DASHBOARD_HTTP_TOKEN"},
                "profiles": {"ops": {"auth_token_env": "MCPMUX_DASHBOARD_OPS_TOKEN"}},
                "inference": {"backend": "off"},
            }
        )
    )
    tokens = {"MCPMUX_DASHBOARD_HTTP_TOKEN": "http-token-1", "MCPMUX_DASHBOARD_OPS_TOKEN": "ops-token-1"}
    with served(config, tokens) as base:
        page = httpx2.get(f"{base}/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy
        assert "connect-src 'self'" in policy
        assert "http://" not in page.text  # nothing loaded from elsewhere
        assert "https://" not in page.text
        assert httpx2.get(f"{base}/dashboard/state").status_code == 401
        profile = httpx2.get(f"{base}/dashboard/state", headers={"Authorization": "Bearer ops-token-1"})
        assert profile.status_code == 403
        assert "bound to profile 'ops'" in profile.text
        state = httpx2.get(f"{base}/dashboard/state", headers={"Authorization": "Bearer http-token-1"})
        assert state.status_code == 200
        assert [upstream["name"] for upstream in state.json()["upstreams"]] == ["alpha"]
        # A foreign site's page cannot read it either (DNS rebinding): the edge checks Host.
        assert httpx2.get(f"{base}/", headers={"Host": "evil.example"}).status_code == 403


@pytest.mark.anyio
async def test_the_state_counts_cache_and_coalescing_hits_per_tool(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    servers = {"alpha": {**demo("alpha"), "cache": {"allow": ["lookup"]}}}
    config.write_text(json.dumps({"mcpServers": servers, "inference": {"backend": "off"}}))
    with served(config) as base:
        async with Client(f"{base}/mcp") as client:
            await client.call_tool("alpha__lookup", {"key": "k"})  # a miss, then kept
            async with anyio.create_task_group() as tasks:
                for _ in range(3):
                    tasks.start_soon(client.call_tool, "alpha__lookup", {"key": "k"})  # cached
                for _ in range(3):
                    tasks.start_soon(client.call_tool, "alpha__lookup", {"key": "fresh"})  # one flight, shared
        state = httpx2.get(f"{base}/dashboard/state").json()
    (lookup,) = [tool for tool in state["tools"] if tool["tool"] == "lookup"]
    assert lookup["calls"] == 7
    assert lookup["cache_hits"] == 3
    assert lookup["coalesced"] == 2
    assert lookup["p50_ms"] is not None
    assert lookup["errors"] == 0
