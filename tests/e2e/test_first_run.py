"""The first hour of a new user: mcpmux as a subprocess, started the ways clients and people start it.

Each test is one thing a user ran into: a config whose paths broke when a client started mcpmux
from another folder, a hung upstream that held everything up, tracebacks at every exit,
unlabelled upstream output, a server that looked hung on a terminal, a banner that said little.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.e2e.conftest import DEMO, PY, ROOT, demo, free_port, stop, text_of, wait_for_port
from tests.inference.tiny_models import build_tiny_model

MCPMUX = [PY, "-m", "mcpmux"]
# Never answers the handshake: prints a line that is not JSON-RPC, then sleeps.
HUNG = {"command": PY, "args": ["-c", "import time; print('hello', flush=True); time.sleep(600)", "hung-upstream"]}
# Says why on stderr, then exits 3 before any handshake.
CRASHY = {"command": PY, "args": ["-c", "import sys; sys.stderr.write('boom: API_KEY is not set\\n'); sys.exit(3)"]}
# Long enough that a test waiting for it would stand out against the seconds a start takes here.
STARTUP_TIMEOUT = 120


def run(*args: str, cwd: str | Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # `python -m mcpmux` from any folder
    return subprocess.run([*MCPMUX, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def config(path: Path, servers: dict[str, object], **mux: object) -> Path:
    path.write_text(json.dumps({"mcpServers": servers, "mux": mux, "inference": {"backend": "off"}}))
    return path


def test_a_config_files_paths_hold_wherever_mcpmux_is_started(tmp_path: Path) -> None:
    """Claude Desktop starts mcpmux in `/`: `.venv/bin/...` and `server.py` in the file still mean its folder."""
    project = tmp_path / "project"
    (project / "bin").mkdir(parents=True)
    (project / "servers").mkdir()
    launcher = project / "bin" / "python-here"
    launcher.write_text(f'#!/bin/sh\nexec "{PY}" "$@"\n')
    launcher.chmod(0o755)
    (project / "servers" / "demo.py").symlink_to(DEMO)
    (project / "mcpmux.toml").write_text(
        '[servers.alpha]\ncommand = "bin/python-here"\nargs = ["servers/demo.py", "alpha"]\n'
        '[inference]\nbackend = "off"\n'
    )
    listed = run("tools", "--config", str(project / "mcpmux.toml"), cwd="/")
    assert "# alpha: ready" in listed.stdout, listed.stdout + listed.stderr
    assert "alpha__echo" in listed.stdout
    checked = run("check", "--config", str(project / "mcpmux.toml"), cwd="/")
    assert checked.returncode == 0, checked.stdout
    assert f"alpha: stdio {launcher} servers/demo.py alpha  (in {project})" in checked.stdout


def test_a_hung_upstream_does_not_delay_a_call_to_another(tmp_path: Path) -> None:
    path = config(tmp_path / "c.json", {"alpha": demo("alpha"), "hung": HUNG}, startup_timeout=STARTUP_TIMEOUT)
    started = time.monotonic()
    called = run("call", "--config", str(path), "alpha__echo", '{"text": "hi"}')
    elapsed = time.monotonic() - started
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["content"][0]["text"] == "alpha: hi"
    assert elapsed < STARTUP_TIMEOUT / 2, elapsed


@pytest.mark.anyio
async def test_a_hung_upstream_does_not_delay_serving(tmp_path: Path) -> None:
    """Over HTTP and stdio, clients are answered at once; the ready upstream's tools arrive by list_changed."""
    path = config(tmp_path / "c.json", {"alpha": demo("alpha"), "hung": HUNG}, startup_timeout=STARTUP_TIMEOUT)
    port = free_port()
    server = subprocess.Popen(
        [*MCPMUX, "serve", "--config", str(path), "--transport", "http", "--port", str(port)], stderr=subprocess.DEVNULL
    )
    try:
        with anyio.fail_after(STARTUP_TIMEOUT / 2):
            await anyio.to_thread.run_sync(wait_for_port, port, server)
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                assert text_of(await _call_when_listed(client, "alpha__echo", {"text": "http"})) == "alpha: http"
    finally:
        stop(server)
    params = StdioServerParameters(command=PY, args=[*MCPMUX[1:], "serve", "--config", str(path)], env=dict(os.environ))
    with anyio.fail_after(STARTUP_TIMEOUT / 2):
        async with Client(params) as client:
            assert text_of(await _call_when_listed(client, "alpha__echo", {"text": "stdio"})) == "alpha: stdio"
    # The client gives mcpmux a few seconds to exit: the hung child, which never got through its
    # handshake, is ended at once rather than given a grace that would outlast them (and orphan it).
    assert not _running("hung-upstream")


def _running(marker: str) -> list[int]:
    """The processes whose command line holds `marker`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes().split(b"\0"):
                found.append(int(cmdline.parent.name))
        except OSError:  # it ended while we looked
            continue
    return found


async def _call_when_listed(client: Client, tool: str, arguments: dict[str, object]) -> object:
    while tool not in {listed.name for listed in (await client.list_tools()).tools}:
        await anyio.sleep(0.2)  # listed once its upstream connects (the client is told with list_changed)
    return await client.call_tool(tool, arguments)


def test_no_traceback_when_mcpmux_stops_an_sdk_server(tmp_path: Path) -> None:
    """`mcpmux tools` and `call` on the example's SDK server: its pipes stay open until it has exited."""
    served = {"summarizer": {"command": PY, "args": [str(ROOT / "examples" / "sampling_server.py")]}}
    path = config(tmp_path / "c.json", served)
    for command in (["tools"], ["call", "summarizer__sample", '{"prompt": "x"}']):
        done = run(*command, "--config", str(path))
        assert "# summarizer: ready" in done.stdout or command[0] == "call", done.stdout
        assert "Traceback" not in done.stderr, done.stderr
        assert "BrokenPipeError" not in done.stderr


def test_upstream_stderr_is_labelled_and_a_down_reason_quotes_it(tmp_path: Path) -> None:
    path = config(tmp_path / "c.json", {"alpha": demo("alpha"), "crashy": CRASHY})
    listed = run("tools", "--config", str(path))
    assert "[crashy] boom: API_KEY is not set" in listed.stderr.splitlines()
    down = next(line for line in listed.stdout.splitlines() if line.startswith("# crashy: down"))
    assert "exited with status 3" in down
    assert "its stderr ended with: boom: API_KEY is not set" in down
    assert "is on mcpmux's stderr" not in down
    as_json = run("--log-format", "json", "tools", "--config", str(path))
    records = [json.loads(line) for line in as_json.stderr.splitlines() if line.startswith("{")]
    said = [
        record for record in records if record.get("upstream") == "crashy" and record["logger"] == "upstream.stderr"
    ]
    assert said[0]["msg"] == "boom: API_KEY is not set"
    assert {"ts", "level", "logger", "msg"} <= said[0].keys()  # the shape of mcpmux's own JSON lines


def test_make_says_what_each_set_up_step_does() -> None:
    """`make run` on a fresh clone: a line before each step, not two silent minutes (make -n: nothing runs)."""
    planned = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", ".venv/.installed"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.splitlines()
    steps = [line for line in planned if "pip install" in line or "-m venv" in line]
    assert len(steps) == 5
    for step in steps:
        before = planned[planned.index(step) - 1]
        assert before.startswith('echo "==> set-up '), (before, step)
    conversion = subprocess.run(["make", "-n", "run"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "CONVERT_SMOLLM2" in conversion
    assert "==> run: converting SmolLM2 once" in (ROOT / "Makefile").read_text()


def test_serve_on_a_terminal_says_it_serves_stdio_and_that_port_needs_http(tmp_path: Path) -> None:
    path = config(tmp_path / "c.json", {"alpha": demo("alpha")})
    terminal, their_end = pty.openpty()
    server = subprocess.Popen(
        [*MCPMUX, "serve", "--config", str(path), "--port", "9999"],
        stdin=their_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(their_end)
    try:
        said = _read_until(server, "Ctrl-C stops it.")
    finally:
        stop(server)
        os.close(terminal)
    assert "--port and --host apply to --transport http" in said
    assert "over stdio: it waits for an MCP client on stdin" in said
    assert f"mcpmux serve --config {path} --transport http" in said


def _read_until(process: subprocess.Popen[str], marker: str, timeout: float = 60) -> str:
    """What `process` wrote to stderr up to the line holding `marker`."""
    assert process.stderr is not None
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"{marker!r} never came; stderr was:\n{''.join(seen)}")


def test_the_banner_gives_every_url_and_each_upstreams_fate(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {"alpha": demo("alpha"), "ghost": {"command": "no-such-binary-here"}},
                "profiles": {"ops": {"servers": ["alpha"]}},
                "mux": {"tool_search": "auto", "tool_search_threshold": 40},
                "inference": {"backend": "off"},
            }
        )
    )
    port = free_port()
    server = subprocess.Popen(
        [*MCPMUX, "serve", "--config", str(path), "--transport", "http", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = _read_until(server, "upstream(s) ready")
    finally:
        stop(server)
    base = f"http://127.0.0.1:{port}"
    for url in (f"{base}/mcp", f"{base}/mcp/ops", f"{base}/metrics", f"{base}/ "):
        assert url in said, said
    assert "2 upstream(s) starting" in said
    assert "tool search: auto: on once the upstreams list more than 40 tools" in said
    assert "upstream alpha: ready (2026-07-28, " in said
    assert "upstream ghost: down: cannot run command 'no-such-binary-here'" in said
    assert "1 of 2 upstream(s) ready" in said


def test_check_flags_a_command_not_on_path_and_both_command_and_url(tmp_path: Path) -> None:
    path = config(tmp_path / "c.json", {"alpha": demo("alpha"), "ghost": {"command": "no-such-binary-here"}})
    checked = run("check", "--config", str(path))
    assert checked.returncode == 1
    assert "1 problem(s)" in checked.stdout
    assert "command 'no-such-binary-here' is not on PATH" in checked.stdout
    both = config(tmp_path / "both.json", {"web": {"command": PY, "url": "http://127.0.0.1:1/mcp"}})
    refused = run("check", "--config", str(both))
    assert refused.returncode == 2
    assert "servers.web: has both 'command' and 'url'" in refused.stderr


def test_help_and_readme_name_what_exists() -> None:
    assert "docs/guide/security.md" in run("serve", "--help").stdout
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Command line", 1)[1].split("```", 2)[1]
    for command in ("serve", "tools", "call", "search", "check", "login", "logout", "status"):
        assert f"mcpmux {command} " in block, command
    assert "--profile" in block
    for doc in ("examples/mcpmux.toml", "mcpmux/cli/main.py", "mcpmux/core/config.py"):
        for ref in _doc_refs((ROOT / doc).read_text()):
            assert (ROOT / ref).is_file(), f"{doc} points at {ref}, which does not exist"


def _doc_refs(text: str) -> list[str]:
    words = text.replace("(", " ").replace(")", " ").replace(";", " ").replace(",", " ").split()
    return [word.strip(".`'\"") for word in words if word.startswith("docs/") and word.strip(".`'\"").endswith(".md")]


@pytest.mark.slow
def test_a_local_model_next_to_the_config_loads_when_mcpmux_starts_elsewhere(tmp_path: Path) -> None:
    """`[inference.models.NAME] model = "models/tiny"` means the folder beside the file, as a server's
    relative `command` does, when a client starts mcpmux from `/`."""
    project = tmp_path / "project"
    build_tiny_model("llama", project / "models" / "tiny")
    (project / "mcpmux.toml").write_text(
        '[inference]\nbackend = "local"\n[inference.models.tiny]\nmodel = "models/tiny"\nkv_cache_memory_mb = 16\n'
        '[inference.embeddings]\nmodel = ""\n'
    )
    arguments = json.dumps({"prompt": "Hello", "max_tokens": 3, "seed": 1})
    called = run("call", "--config", str(project / "mcpmux.toml"), "local__generate", arguments, cwd="/", timeout=600)
    assert called.returncode == 0, called.stderr
    assert "cannot load" not in called.stderr
