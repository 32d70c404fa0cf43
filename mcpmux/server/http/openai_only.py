"""`mcpmux serve --openai-only`: the OpenAI-compatible API alone, over HTTP, with no upstreams."""

from __future__ import annotations

import socket
import sys

import anyio
import uvicorn

from mcpmux.core.metrics import engine_registry, metrics_route
from mcpmux.inference.openai.routes import openai_app
from mcpmux.inference.serving.service import InferenceService
from mcpmux.inference.serving.settings import InferenceSettings
from mcpmux.server.http.edge import HttpEdge
from mcpmux.server.http.edge_policy import EdgePolicy
from mcpmux.server.http.quiet_server import DatedProtocol, QuietServer


async def serve_openai_only(
    settings: InferenceSettings, sock: socket.socket, stop: anyio.Event, edge: EdgePolicy
) -> None:
    """Start the service, serve `/v1` (behind the `edge` checks) on the bound socket until `stop` is set."""
    async with await InferenceService.start(settings) as service:
        host, port = sock.getsockname()[:2]
        sys.stderr.write(f"mcpmux serving the OpenAI-compatible API at http://{host}:{port}/v1\n")
        sys.stderr.flush()
        app = openai_app(service)
        app.router.routes.append(metrics_route(engine_registry(service)))
        config = uvicorn.Config(HttpEdge(app, edge), http=DatedProtocol, log_level="warning", lifespan="off")
        server = QuietServer(config)
        async with anyio.create_task_group() as tasks:

            async def stop_when_asked() -> None:
                await stop.wait()
                server.should_exit = True

            tasks.start_soon(stop_when_asked)
            await server.serve(sockets=[sock])
            tasks.cancel_scope.cancel()
