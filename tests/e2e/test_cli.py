"""The `mcpmux` command as a user runs it, and third-party servers through it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.e2e.conftest import (
    DEMO,
    EVERYTHING,
    PY,
    ROOT,
    demo,
    everything_available,
    free_port,
    gone,
    mux_over_stdio,
    text_of,
    wait_for_port,
    write_config,
)

MCPMUX = [PY, "-m", "mcpmux"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MCPMUX, *args], capture_output=True, text=True, timeout=120)


def test_version_and_help() -> None:
    assert run("--version").stdout.startswith("mcpmux ")
    help_text = run("--help").stdout
    assert "examples:" in help_text
    assert "mcpmux serve -- npx" in help_text


def test_check_prints_resolved_upstreams_and_rejects_bad_files(tmp_path: Path) -> None:
    good = write_config(tmp_path / "good.json", {"alpha": demo("alpha"), "web": {"url": "http://127.0.0.1:1/mcp"}})
    checked = run("check", "--config", str(good))
    assert checked.returncode == 0
    assert "alpha: stdio" in checked.stdout
    assert "web: http http://127.0.0.1:1/mcp" in checked.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[servers.x]\ncommand = "a"\nargz = []\n')
    rejected = run("check", "--config", str(bad))
    assert rejected.returncode == 2
    assert f"{bad}: invalid configuration" in rejected.stderr
    assert "servers.x.argz: unknown key" in rejected.stderr
    assert run("tools", "--config", str(tmp_path / "nope.toml")).stderr.strip().endswith("no such file")


def test_tools_and_call(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha"), "ghost": {"command": "no-such-binary-here"}})
    listed = run("tools", "--config", str(config))
    assert "# alpha: ready, stdio, 2026-07-28" in listed.stdout
    assert "# ghost: down" in listed.stdout
    assert "cannot run command" in listed.stdout
    assert "alpha__echo\tReturn the text unchanged." in listed.stdout
    called = run("call", "--config", str(config), "alpha__add", '{"a": 20, "b": 22}')
    assert called.returncode == 0
    assert json.loads(called.stdout)["content"][0]["text"] == "42"
    bad_args = run("call", "--config", str(config), "alpha__add", "{not json")
    assert bad_args.returncode == 2
    assert "arguments are not valid JSON" in bad_args.stderr


@pytest.mark.anyio
async def test_tools_json_prints_each_tool_as_its_upstream_lists_it(tmp_path: Path) -> None:
    """`mcpmux tools --json`: stdout is the catalog alone, as JSON a script reads, each upstream tool
    under its public name with its schemas exactly as the upstream listed them; status lines on stderr."""
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")})
    listed = await anyio.to_thread.run_sync(lambda: run("tools", "--json", "--config", str(config)))
    assert listed.returncode == 0, listed.stderr
    assert "# alpha: ready, stdio" in listed.stderr
    printed = {tool["name"]: tool for tool in json.loads(listed.stdout)}
    async with Client(StdioServerParameters(command=PY, args=[str(DEMO), "alpha"])) as direct:
        upstream = (await direct.list_tools()).tools
    assert upstream
    for tool in upstream:
        ours = printed[f"alpha__{tool.name}"]
        assert ours["inputSchema"] == tool.input_schema
        assert ours.get("outputSchema") == tool.output_schema
        assert ours.get("description") == tool.description


def test_every_call_error_is_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    """An upstream down, a mistyped name, a tool's own error: one line of mcpmux's on stderr, no traceback."""
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha"), "ghost": {"command": "no-such-binary-here"}})
    cases = [
        # (tool, arguments, exit code, what the line says)
        ("ghost__greet", "{}", 1, "tool 'ghost__greet' is not listed: upstream 'ghost' is down (cannot run command"),
        ("alpha__ech", "{}", 2, "unknown tool 'alpha__ech'; did you mean 'alpha__echo'"),
        # No count of "listed" tools: the client's list holds mcpmux's own too, and the numbers disagreed.
        ("zzzz", "{}", 2, "unknown tool 'zzzz'; none listed is close (tools/list)"),
        ("alpha__fail", '{"reason": "no"}', 1, "alpha__fail answered with an error: Error executing tool fail"),
        ("alpha__add", "[1, 2]", 2, "arguments must be a JSON object, got list"),
    ]
    for tool, arguments, code, says in cases:
        called = run("call", "--config", str(config), tool, arguments)
        assert called.returncode == code, (tool, called.stderr)
        # The upstream's own stderr passes through; mcpmux's is the one line.
        lines = [line for line in called.stderr.splitlines() if line.startswith("mcpmux: ")]
        assert len(lines) == 1, called.stderr
        assert says in lines[0], lines
        assert "/mcpmux/" not in called.stderr  # no traceback of mcpmux's
    ghost = run("call", "--config", str(config), "ghost__greet", "{}").stderr
    assert "fix [servers.ghost] in" in ghost
    assert "`mcpmux tools`" in ghost


@pytest.mark.anyio
async def test_serve_wraps_one_command_without_a_config() -> None:
    params = StdioServerParameters(command=PY, args=["-m", "mcpmux", "serve", "--", PY, str(DEMO), "solo"])
    async with Client(params) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"echo", "add"} <= names
        assert text_of(await client.call_tool("echo", {"text": "wrapped"})) == "solo: wrapped"


@pytest.mark.anyio
async def test_closing_stdin_ends_mcpmux_and_its_children(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")})
    async with mux_over_stdio(config) as client:
        pid = int(text_of(await client.call_tool("alpha__pid", {})))
    assert gone(pid)


@pytest.mark.anyio
async def test_sigterm_ends_the_http_server_and_its_children(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")})
    port = free_port()
    process = subprocess.Popen(
        [*MCPMUX, "serve", "--config", str(config), "--transport", "http", "--port", str(port)],
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_port(port, process)
    async with Client(f"http://127.0.0.1:{port}/mcp") as client:
        pid = int(text_of(await client.call_tool("alpha__pid", {})))
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0
    assert f"http://127.0.0.1:{port}/mcp" in stderr
    assert '"mcpServers"' in stderr
    assert gone(pid)


@pytest.mark.anyio
async def test_third_party_servers_through_mcpmux(tmp_path: Path) -> None:
    servers = {"time": {"command": str(Path(PY).parent / "mcp-server-time")}}
    if everything_available():
        servers["everything"] = {"command": "node", "args": [str(EVERYTHING), "stdio"]}
    config = write_config(tmp_path / "c.json", servers)
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with mux_over_stdio(config) as client:
        now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert json.loads(text_of(now))["timezone"] == "UTC"
        if everything_available():  # the 2025-11-25 npm reference server
            assert text_of(await client.call_tool("everything__echo", {"message": "hi"})) == "Echo: hi"
            assert "30" in text_of(await client.call_tool("everything__get-sum", {"a": 10, "b": 20}))
            with anyio.fail_after(30):
                await client.call_tool(
                    "everything__trigger-long-running-operation",
                    {"duration": 1, "steps": 3},
                    progress_callback=on_progress,
                )
            assert progress == [1, 2, 3]


def test_a_port_in_use_is_one_line_before_any_upstream_starts(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", {"alpha": demo("alpha")})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [*MCPMUX, "serve", "--config", str(config), "--transport", "http", "--port", str(port)]
        alone = {name: value for name, value in os.environ.items() if name != "MAKELEVEL"}  # `make test` sets it
        served = subprocess.run(command, capture_output=True, text=True, timeout=120, env=alone)
        under_make = {**alone, "MAKELEVEL": "1"}  # what make gives the commands it runs
        under_make_run = subprocess.run(command, capture_output=True, text=True, timeout=120, env=under_make)
    assert served.returncode == 2
    assert served.stderr.strip() == (
        f"mcpmux: cannot listen on 127.0.0.1:{port}: Address already in use; pass another --port "
        "(or [http] port), or stop what holds that one"
    )
    assert under_make_run.stderr.strip().endswith(f"(under `make run`: PORT={port + 1} make run)")


def test_a_call_the_upstream_fails_exits_1_never_the_usage_status(tmp_path: Path) -> None:
    """2 says the command was wrong; an upstream that timed out, broke its connection or answered
    with a JSON-RPC error is not that."""
    from tests.e2e.test_http_lane import raw_http_server

    with raw_http_server() as url:
        config = write_config(tmp_path / "c.json", {"raw": {"url": url, "timeout": 0.5}})
        for tool, says in [
            ("raw__slow", "did not answer tool 'slow' within 0.5s"),
            ("raw__vanish", "lost its connection during tool 'vanish', before answering"),
            ("raw__refuse", "refused by the server"),
        ]:
            called = run("call", "--config", str(config), tool, "{}")
            assert called.returncode == 1, called.stderr
            assert says in called.stderr


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["legacy", "auto"])
def test_call_accepts_a_forms_defaults_only_when_told_and_only_where_every_required_field_has_one(
    tmp_path: Path, protocol: str
) -> None:
    """Nobody is there to answer `mcpmux call`'s elicitations: declined, unless `--accept-defaults` says to
    take a form's defaults (SEP-1034), which it does only for a form whose every required field has one.
    Both eras: a 2025 upstream pushes the request, a 2026 one asks in an input-required round."""
    asking = {"command": PY, "args": [str(ROOT / "tests" / "servers" / "asking_server.py")], "protocol": protocol}
    config = write_config(tmp_path / "c.json", {"asking": asking})

    def call(tool: str, *flags: str) -> tuple[dict[str, Any], str]:
        called = run("call", *flags, "--config", str(config), tool, "{}")
        assert called.returncode == 0, called.stderr
        return json.loads(called.stdout)["structuredContent"], called.stderr

    kept, said = call("asking__profile", "--accept-defaults")
    assert kept == {"action": "accept", "content": {"name": "John Doe", "age": 30, "score": 95.5, "verified": True}}
    assert "accepted upstream 'asking''s form ('Review your profile') with its defaults" in said
    unasked, said = call("asking__profile")
    assert unasked == {"action": "decline", "content": None}
    assert "run `mcpmux call --accept-defaults` to accept them" in said
    no_default, said = call("asking__signup", "--accept-defaults")
    assert no_default == {"action": "decline", "content": None}
    assert "accepted" not in said
