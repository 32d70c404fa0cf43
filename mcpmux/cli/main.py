"""`mcpmux serve | tools | call | search | check`. Logs go to stderr; stdout carries results (and, for stdio, MCP)."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcpmux import __version__
from mcpmux.cli.banner import http_banner, report_upstreams, say, stdio_notice
from mcpmux.cli.check import check_servers
from mcpmux.cli.form_defaults import form_defaults_asker
from mcpmux.cli.login import add_login_parsers, login_main, logout_main
from mcpmux.cli.status import add_status_parser, status_main
from mcpmux.core.config import Config, config_from_dict, load_config
from mcpmux.core.logs import configure_logging
from mcpmux.errors import MuxError
from mcpmux.mux.multiplexer import Mux
from mcpmux.mux.reload import ConfigReloader
from mcpmux.server.frontend import Frontend, bind
from mcpmux.server.http.edge_policy import prepare_edge
from mcpmux.upstream import children
from mcpmux.upstream.oauth.upstream_auth import name_config_file

EXAMPLES = """examples:
  mcpmux serve --config mcpmux.toml                      serve over stdio (what MCP clients launch)
  mcpmux serve --config mcpmux.toml --transport http     streamable HTTP on http://127.0.0.1:8765/mcp
  mcpmux serve -- npx -y @modelcontextprotocol/server-everything stdio
                                                         wrap one server, no config file
  mcpmux tools --config ~/Library/Application\\ Support/Claude/claude_desktop_config.json
  mcpmux call --config mcpmux.toml time__get_current_time '{"timezone": "UTC"}'
  mcpmux call --accept-defaults --config mcpmux.toml db__migrate    take a form's defaults if it asks one
  mcpmux search --config mcpmux.toml "open an issue on GitHub"   rank the tools for a task
  mcpmux check --config .vscode/mcp.json
  mcpmux login docs --config mcpmux.toml                 OAuth login to the HTTP upstream "docs"
  mcpmux status --url http://127.0.0.1:8765              summary of a running HTTP server's /metrics

--config defaults to $MCPMUX_CONFIG, then ./mcpmux.toml. Accepted formats: mcpmux.toml, Claude
Desktop / Cursor / Claude Code JSON ({"mcpServers": ...}) and VS Code JSON ({"servers": ...}).
"""


def _no_progress_monitor() -> None:
    """tqdm starts a monitor thread with its first bar, even a disabled one (tool search's BM25 index
    makes one), which wakes every 10 s for the life of the process to hurry stalled bars; a server's
    bars (a model's one-time conversion) do without it, and an idle server is then not woken."""
    import tqdm  # imported here: only `serve` builds indexes and loads models

    tqdm.tqdm.monitor_interval = 0


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level or ("warning" if args.command == "serve" else "error"), args.log_format)
    if args.command == "status":  # talks to a running server: no config of its own
        sys.exit(status_main(args))
    if args.command == "serve":
        _no_progress_monitor()
    try:
        config = _resolve_config(args)
        code = anyio.run(_COMMANDS[args.command], args, config)
    except (MuxError, BaseExceptionGroup) as err:
        error = _mux_error(err)
        if error is None:
            raise
        print(f"mcpmux: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


def _mux_error(err: BaseException) -> MuxError | None:
    """The mcpmux error that ended a command, also from inside task groups; None for anything else (a bug)."""
    if isinstance(err, MuxError):
        return err
    if isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
        return _mux_error(err.exceptions[0])
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcpmux",
        description="One MCP server in front of many: a namespaced catalog, routing, supervision.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mcpmux {__version__}")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="stderr log level (default: warning for serve, error for the one-shot commands, which say what failed)",
    )
    parser.add_argument("--log-format", default="text", choices=["text", "json"], help="stderr lines as text or JSON")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the multiplexer as an MCP server")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default=None, help="HTTP host (default: [http] host, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="HTTP port (default: [http] port, 8765)")
    serve.add_argument(
        "--openai-only",
        action="store_true",
        help="serve only the OpenAI-compatible API at /v1 over HTTP ([inference]; no upstreams are started)",
    )
    serve.add_argument(
        "--allow-unauthenticated-remote",
        action="store_true",
        help="serve HTTP on a non-loopback address with no [http] auth tokens set (docs/guide/security.md)",
    )
    serve.add_argument(
        "--profile", default=None, help="serve only what [profiles.NAME] allows: its servers' and tools' globs"
    )
    serve.add_argument("wrapped", nargs=argparse.REMAINDER, help="-- CMD ARGS...: wrap one stdio server")
    tools = commands.add_parser("tools", help="list the aggregated catalog and each upstream's status")
    tools.add_argument(
        "--json",
        action="store_true",
        help="print each tool as tools/list gives it (name, description, input and output schemas), as JSON",
    )
    call = commands.add_parser("call", help="call one tool and print its result as JSON")
    call.add_argument("tool")
    call.add_argument("arguments", nargs="?", default="{}", help="the arguments as a JSON object")
    call.add_argument(
        "--accept-defaults",
        action="store_true",
        help="accept an upstream's form elicitation whose every required field has a default, with its defaults "
        "(else every elicitation is declined: nobody is there to answer it)",
    )
    search = commands.add_parser("search", help="rank the catalog's tools for a task, as mux_search_tools does")
    search.add_argument("query", help="the task in plain words")
    search.add_argument("--limit", "-n", type=int, default=10, help="how many tools to print (1 to 50, default 10)")
    search.add_argument("--servers", nargs="+", default=None, metavar="GLOB", help="only servers matching these")
    search.add_argument("--profile", default=None, help="search only what [profiles.NAME] allows")
    commands.add_parser("check", help="validate the config and print the resolved upstreams")
    add_login_parsers(commands)
    for sub in commands.choices.values():
        sub.add_argument("--config", "-c", default=None, help="config file (TOML or client JSON)")
    add_status_parser(commands)
    return parser


def _wrapped(args: argparse.Namespace) -> list[str]:
    """The command line of `mcpmux serve -- CMD ARGS...`; empty when a config file is served."""
    return [part for part in getattr(args, "wrapped", []) if part != "--"]


def _resolve_config(args: argparse.Namespace) -> Config:
    wrapped = _wrapped(args)
    if wrapped:
        name = Path(wrapped[0]).name.split(".")[0] or "server"
        return config_from_dict(
            {"servers": {name: {"command": wrapped[0], "args": wrapped[1:]}}, "mux": {"prefix_single": False}},
            source=f"command line: {shlex.join(wrapped)}",
        )
    path = args.config or os.environ.get("MCPMUX_CONFIG") or "mcpmux.toml"
    if not Path(path).exists() and args.config is None:
        raise MuxError("no config given: pass --config FILE, set MCPMUX_CONFIG, or create ./mcpmux.toml")
    name_config_file(path)  # what a `needs login` error tells the user to pass to `mcpmux login`
    return load_config(path)


async def _serve(args: argparse.Namespace, config: Config) -> int:
    """Serve until stdin closes (stdio) or SIGINT/SIGTERM arrives; upstream children end with the Mux.

    SIGINT/SIGTERM stop accepting, let calls in flight finish within `[mux] shutdown_grace` and cancel
    the rest (a second signal skips the wait, and the upstream processes are ended without theirs); a
    signal once serving is over (stdin closed, say) ends the upstream processes at once. SIGHUP, or a
    change to the file, reloads the config.
    """
    if args.openai_only:
        return await _serve_openai_only(args, config)
    host = args.host or config.http.host
    # Read (a non-loopback bind without tokens refused) and bound before any upstream starts.
    edge = prepare_edge(config, host, args.allow_unauthenticated_remote) if args.transport == "http" else None
    sock = _listen(host, config.http.port if args.port is None else args.port) if edge is not None else None
    signals = _Signals(reloadable=not _wrapped(args))
    # The signal handler outlives the Mux: a signal while it starts or stops still ends every child.
    async with anyio.create_task_group() as handling:
        handling.start_soon(signals.handle, handling)
        # Served at once: an upstream that is slow to start joins the catalog when it connects (list_changed).
        mux = Mux(config, profile=args.profile, wait_for_upstreams=False)
        async with mux, anyio.create_task_group() as tasks:
            frontend = Frontend(mux)
            _announce_inference(mux)
            _freeze_startup_heap()
            if args.transport == "stdio":
                port_given = args.port is not None or args.host is not None
                say(stdio_notice(mux, port_given, sys.stdin.isatty()))
            tasks.start_soon(report_upstreams, mux)
            stop, skip = signals.stop, signals.skip
            reloader = None if _wrapped(args) else ConfigReloader(mux, config.source)
            if reloader is not None:
                signals.attach(reloader, tasks)
                tasks.start_soon(reloader.watch)
            if args.transport == "stdio":
                async with anyio.create_task_group() as serving:
                    serving.start_soon(_drain_when_stopped, mux, stop, skip, serving.cancel_scope.cancel)
                    await frontend.serve_stdio()
                    serving.cancel_scope.cancel()  # stdin closed: no client is left to answer
            else:
                assert edge is not None
                assert sock is not None
                say(http_banner(mux, host, sock.getsockname()[1]))
                drained = anyio.Event()
                tasks.start_soon(_drain_when_stopped, mux, stop, skip, drained.set)
                await frontend.serve_http(sock, edge, config.http.path, stop, shutdown_timeout=2, drained=drained)
            signals.exiting(handling)
            tasks.cancel_scope.cancel()
        handling.cancel_scope.cancel()
    return 0


def _announce_inference(mux: Mux) -> None:
    """Which models serve and from where (the service logs it at info; said here at any log level)."""
    if mux.inference is not None and not logging.getLogger("mcpmux.inference").isEnabledFor(logging.INFO):
        sys.stderr.write("".join(f"mcpmux inference: {line}\n" for line in mux.inference.description))
        sys.stderr.flush()


def _freeze_startup_heap() -> None:
    """Keep what start-up built (modules, the SDK's models, the catalog: some 100,000 objects) out of
    the cycle collector's full passes, which otherwise walk all of it every few seconds under load
    (90-160 ms each on a slow 2-core host, a stall for every call in flight). What start-up built
    and a later reload drops stays in memory: one copy at most."""
    gc.collect()
    gc.freeze()


async def _serve_openai_only(args: argparse.Namespace, config: Config) -> int:
    """Only `/v1`, over HTTP, until SIGINT/SIGTERM; the engine loads here (torch is imported only now)."""
    if config.inference.backend == "off":
        raise MuxError(f'--openai-only needs [inference] backend = "local" or "openai" in {config.source}')
    host = args.host or config.http.host
    edge = prepare_edge(config, host, args.allow_unauthenticated_remote)
    from mcpmux.server.http.openai_only import serve_openai_only

    async with anyio.create_task_group() as tasks:
        stop = anyio.Event()
        tasks.start_soon(_stop_on_signal, stop)
        sock = _listen(host, config.http.port if args.port is None else args.port)
        await serve_openai_only(config.inference, sock, stop, edge)
        tasks.cancel_scope.cancel()
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """`bind`; under `make run` (make sets MAKELEVEL) its advice on a port in use names make's variable."""
    try:
        return bind(host, port)
    except MuxError as err:
        if "MAKELEVEL" not in os.environ:
            raise
        raise MuxError(f"{err} (under `make run`: PORT={port + 1} make run)") from None


async def _stop_on_signal(stop: anyio.Event) -> None:
    """Winds down through `stop` (uvicorn finishes open responses)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            logging.getLogger("mcpmux").info("%s received: shutting down", signal.Signals(signum).name)
            stop.set()
            return


class _Signals:
    """What `mcpmux serve` does on a signal. SIGINT/SIGTERM: the first sets `stop` (calls in flight get
    their grace); a second sets `skip` (they are cancelled now); one once serving is over (`exiting`),
    or a second one by then, ends the upstream processes at once (`children.hurry`). SIGHUP reloads."""

    def __init__(self, reloadable: bool) -> None:
        self.stop = anyio.Event()
        self.skip = anyio.Event()
        self.reloadable = reloadable
        """Serving a config file (not a command line): SIGHUP reads it again."""
        self.reloader: ConfigReloader | None = None
        """Reloads the config file, in `reloads`, while serving one."""
        self.reloads: TaskGroup | None = None
        self._reload_asked = False
        self._exiting: TaskGroup | None = None

    def attach(self, reloader: ConfigReloader, tasks: TaskGroup) -> None:
        """Serving has started: SIGHUP reloads with `reloader` in `tasks` (one received while starting, now)."""
        self.reloader, self.reloads = reloader, tasks
        if self._reload_asked:
            tasks.start_soon(reloader.reload)

    def exiting(self, tasks: TaskGroup) -> None:
        """Serving is over and the upstreams are stopped next (a hurried child ends in `tasks`)."""
        self.reloader = None
        self.stop.set()
        self._exiting = tasks
        if self.skip.is_set():
            tasks.start_soon(children.hurry)

    async def handle(self, tasks: TaskGroup) -> None:
        log = logging.getLogger("mcpmux")
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum != signal.SIGHUP:
                    if self._exiting is not None:
                        log.warning("%s received while stopping: upstream processes end now", name)
                        self._exiting.start_soon(children.hurry)
                    elif self.stop.is_set():
                        log.warning("%s received: skipping the rest of the grace period", name)
                        self.skip.set()
                    else:
                        log.warning("%s received: shutting down", name)
                        self.stop.set()
                elif self.stop.is_set():
                    continue
                elif not self.reloadable:
                    log.warning("SIGHUP received: nothing to reload (serving a command line, not a config file)")
                elif self.reloader is None or self.reloads is None:
                    log.warning("SIGHUP received while starting: the config file is read again once started")
                    self._reload_asked = True
                else:
                    log.warning("SIGHUP received: reloading %s", self.reloader.path)
                    self.reloads.start_soon(self.reloader.reload)


async def _drain_when_stopped(mux: Mux, stop: anyio.Event, skip: anyio.Event, then: Callable[[], object]) -> None:
    """Once `stop` is set, let calls in flight finish (`[mux] shutdown_grace`), then call `then`."""
    await stop.wait()
    await mux.drain(mux.config.mux.shutdown_grace, skip)
    await anyio.sleep(0.25)  # the last answers leave the Mux before the front end has written them
    then()


async def _tools(args: argparse.Namespace, config: Config) -> int:
    """Each upstream's status, then the catalog; with `--json`, stdout is the catalog alone, as JSON
    (each tool as tools/list gives it, its schemas unchanged), and the status lines go to stderr."""
    async with Mux(config) as mux:
        for status in mux.status():
            error = f"  ({status.last_error})" if status.last_error else ""
            auth = f", auth: {status.auth}" if status.transport == "http" else ""
            print(
                f"# {status.name}: {status.state.value}, {status.transport}, {status.protocol_version or '-'}"
                f"{auth}{error}",
                file=sys.stderr if args.json else sys.stdout,
            )
        tools = mux.list_tools()
        if args.json:
            print(
                json.dumps([tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools], indent=2)
            )
        else:
            for tool in tools:
                summary = (tool.description or "").strip().splitlines()[0] if tool.description else ""
                print(f"{tool.name}\t{summary}")
        failed = [s for s in mux.status() if s.state.value != "ready"]
    return 1 if failed else 0


async def _call(args: argparse.Namespace, config: Config) -> int:
    try:
        arguments: Any = json.loads(args.arguments)
    except json.JSONDecodeError as err:
        raise MuxError(f"arguments are not valid JSON ({err.msg} at column {err.colno}): {args.arguments}") from None
    if not isinstance(arguments, dict):
        raise MuxError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    # Only the tool's own upstream is waited for (`Mux.call_tool`): a hung other one delays nothing.
    async with Mux(config, wait_for_upstreams=False) as mux:
        mux.client_requests.asker = form_defaults_asker(args.accept_defaults)
        result = await mux.call_tool(args.tool, arguments)
    print(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True), indent=2))
    if result.is_error:  # the JSON above for scripts, one line here for whoever reads the terminal
        text = " ".join(getattr(block, "text", "") for block in result.content).split()
        print(f"mcpmux: {args.tool} answered with an error: {' '.join(text) or '(no text)'}", file=sys.stderr)
        return 1
    return 0


async def _search(args: argparse.Namespace, config: Config) -> int:
    """Print the best tools for `args.query`, best first: score, name, first line of the description."""
    if not 1 <= args.limit <= 50:
        raise MuxError(f"--limit must be between 1 and 50, got {args.limit}")
    if config.mux.tool_search == "off":  # the command searches whatever the served mode is
        config = config.model_copy(update={"mux": config.mux.model_copy(update={"tool_search": "on"})})
    async with Mux(config, profile=args.profile) as mux:
        search = mux.tool_search
        assert search is not None
        search.query_timeout = SEARCH_INDEX_WAIT
        found = await search.search(args.query, args.limit, args.servers, wait=SEARCH_INDEX_WAIT)
        failed = [s.name for s in mux.status() if s.state.value != "ready"]
    for hit in found.hits:
        summary = hit.doc.description.strip().splitlines()[0] if hit.doc.description.strip() else ""
        print(f"{hit.score:.4f}\t{hit.doc.name}\t{summary}")
    down = f"; not connected: {', '.join(failed)}" if failed else ""
    total = len(search.index.docs)
    print(f"mcpmux: {len(found.hits)} of {total} tools, ranked by {found.method}{down}", file=sys.stderr)
    return 0 if found.hits else 1


SEARCH_INDEX_WAIT = 120.0
"""Seconds `mcpmux search` waits for the catalog's embeddings (a cold cache embeds every tool first) before
BM25 alone; `mux_search_tools` waits `READY_WAIT`, as a client's call cannot wait that long."""


async def _check(args: argparse.Namespace, config: Config) -> int:
    lines, problems = check_servers(config)
    verdict = "OK" if not problems else f"{problems} problem(s)"
    print(f"{config.source}: {verdict}, {len(config.servers)} server(s)")
    print("\n".join(lines))
    return 0 if not problems else 1


_COMMANDS = {
    "serve": _serve,
    "tools": _tools,
    "call": _call,
    "search": _search,
    "check": _check,
    "login": login_main,
    "logout": logout_main,
}
