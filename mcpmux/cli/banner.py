"""What `mcpmux serve` tells the person who started it, on stderr: where it serves, and each upstream's fate.

The server answers at once and its upstreams connect behind it, so the banner says only what is
known at once (the URLs of every route, the profiles, the search mode as configured, how a client
adds it) and each upstream gets its own line when it is ready or down, with the reason and what
to do. On a terminal, serving stdio says so: a server that waits silently for a client looks hung.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

from mcpmux import __version__
from mcpmux.core.config import Config
from mcpmux.mux.multiplexer import Mux
from mcpmux.upstream.supervisor import Upstream, UpstreamState


def say(text: str) -> None:
    """Write to stderr (stdout may be the MCP stream)."""
    sys.stderr.write(text)
    sys.stderr.flush()


def stdio_notice(mux: Mux, port_given: bool, on_terminal: bool) -> str:
    """What serving stdio says: `--port`/`--host` do nothing without `--transport http`, and on a
    terminal, that mcpmux now waits for an MCP client on stdin ('' when there is nothing to say)."""
    lines = []
    if port_given:
        lines.append("mcpmux: --port and --host apply to --transport http; serving stdio, they are ignored")
    if on_terminal:
        count = len(mux.upstreams)
        lines.append(
            f"mcpmux {__version__} serves {count} upstream(s) over stdio: it waits for an MCP client on stdin.\n"
            "  MCP clients launch it this way themselves (README: Using it from an MCP client).\n"
            f"  For a server to connect to: mcpmux serve --config {mux.config.source} --transport http\n"
            "  Ctrl-C stops it."
        )
    return "".join(f"{line}\n" for line in lines)


def http_banner(mux: Mux, host: str, port: int) -> str:
    """Every route's URL, the profiles, the search mode, and the snippets that add mcpmux to a client."""
    config = mux.config
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    url = f"{base}{config.http.path}"
    rows = [("MCP", url, "")]
    for name in sorted(config.profiles):
        rows.append(("profile", f"{url}/{name}", f"[profiles.{name}]"))
    rows.append(("dashboard", f"{base}/", "live status in a browser"))
    inference = mux.inference
    if inference is not None and inference.settings.openai_api:
        rows.append(("OpenAI API", f"{base}/v1", ", ".join(inference.model_names())))
    rows.append(("metrics", f"{base}/metrics", "Prometheus; `mcpmux status` reads it"))
    width = max(len(label) for label, _, _ in rows)
    table = "".join(f"  {label:<{width}}  {where}{f'   ({note})' if note else ''}\n" for label, where, note in rows)
    return (
        f"mcpmux {__version__} serving {config.source}: {len(mux.upstreams)} upstream(s) starting\n"
        f"{table}"
        f"  tool search: {_search_mode(config)}\n\n"
        f"Claude Desktop (stdio; claude_desktop_config.json):\n{json.dumps(_stdio_entry(config), indent=2)}\n\n"
        f"Claude Code:  claude mcp add --transport http mcpmux {url}\n"
        f'VS Code:      {{"servers": {{"mcpmux": {{"type": "http", "url": "{url}"}}}}}}\n\n'
    )


def _search_mode(config: Config) -> str:
    settings = config.mux
    if settings.tool_search == "on":
        return "on: tools/list shows mcpmux's own tools and pinned_tools; the rest are found with mux_search_tools"
    if settings.tool_search == "off":
        return "off: tools/list shows every tool"
    return f"auto: on once the upstreams list more than {settings.tool_search_threshold} tools"


def _stdio_entry(config: Config) -> dict[str, object]:
    serve = ["serve", "--config", _absolute(config.source)]
    launcher = Path(sys.argv[0]).resolve()
    if launcher.name == "__main__.py":  # started as `python -m mcpmux`: a client must start it so too
        return {"mcpServers": {"mcpmux": {"command": sys.executable, "args": ["-m", "mcpmux", *serve]}}}
    return {"mcpServers": {"mcpmux": {"command": str(launcher), "args": serve}}}


def _absolute(source: str) -> str:
    path = Path(source)
    return str(path.resolve()) if path.exists() else source


async def report_upstreams(mux: Mux) -> None:
    """One line per upstream as it settles (ready, or down and why), then one saying how many are ready."""
    upstreams = list(mux.upstreams.values())
    async with anyio.create_task_group() as tasks:
        for upstream in upstreams:
            tasks.start_soon(_report, upstream)
    ready = sum(1 for upstream in upstreams if upstream.state == UpstreamState.READY)
    if ready < len(upstreams):
        say(f"mcpmux: {ready} of {len(upstreams)} upstream(s) ready; the others are retried in the background\n")


async def _report(upstream: Upstream) -> None:
    await upstream.settled.wait()
    say(upstream_line(upstream) + "\n")


def upstream_line(upstream: Upstream) -> str:
    """`upstream NAME: ready (revision, N tools)`, or its state and reason."""
    status = upstream.status()
    if status.state == UpstreamState.READY:
        return f"upstream {status.name}: ready ({status.protocol_version}, {status.tools} tools)"
    reason = f": {status.last_error}" if status.last_error else ""
    return f"upstream {status.name}: {status.state.value}{reason}"
