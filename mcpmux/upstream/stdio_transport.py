"""The transport to a stdio upstream: the child's pipes read and written right on the event loop.

The SDK's `stdio_client` puts two tasks between a session and its child's pipes, and a pydantic
model around every line. The fast path (`mcpmux.upstream.lane`) needs neither: its requests are
written here as raw JSON lines by the calling task itself, and each line read that answers one
(or reports its progress) is parsed once, as raw JSON, and handed to the waiting call. Everything
else (the handshake, listings, the SDK path's calls, notifications, lines that are not JSON-RPC)
reaches the client session exactly as from the SDK's transport.

The child runs in a session of its own, with the SDK's default environment under the one given;
its stderr goes to a `ChildStderr`, which passes each line on to mcpmux's stderr labelled with the
upstream's name and keeps the last ones, with the exit status, for the reason it went down.

Shutdown follows the spec's sequence, as the SDK's transport does: close the child's stdin, give it
`EXIT_GRACE` seconds to exit, then SIGTERM its process group and SIGKILL whatever is left; unlike
the SDK's, it also ends what the child left running in its group, and it reads both pipes until
the child is gone. A signal during mcpmux's shutdown cuts that short (`mcpmux.upstream.children`).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from pydantic_core import from_json

from mcpmux.upstream import children
from mcpmux.upstream.child_stderr import ChildStderr
from mcpmux.upstream.lane import LANE_ID_MARK, UpstreamLane
from mcpmux.wire.json_bytes import line
from mcpmux.wire.stdio_lines import LineWriter, read_lines

logger = logging.getLogger(__name__)

EXIT_GRACE = 2.0
"""Seconds a child has to exit once its stdin is closed, and again after SIGTERM before SIGKILL."""

_FLUSH_TIMEOUT = 0.5  # for the session's last messages to reach the child before its stdin closes
_STDERR_DRAIN = 0.5  # for the last stderr lines of a child that ended to be read (a grandchild may hold the pipe)
_EXIT_POLL = 0.01


@asynccontextmanager
async def stdio_transport(
    command: str,
    args: list[str],
    env: dict[str, str],
    cwd: str | None,
    lane: UpstreamLane,
    stderr: ChildStderr,
    spoke: anyio.Event,
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the child and yield the (read, write) streams of `SessionMessage`s an SDK `Client` takes.

    `lane` is attached to the child's stdin and takes its messages off the child's stdout; `stderr`
    reads the child's stderr and is told its exit status. `spoke` is set once the MCP handshake
    ended: a child still running that never got that far has nothing to finish, and is not given
    `EXIT_GRACE` to exit before SIGTERM (a hung one would hold up every shutdown by it, past the
    few seconds a client gives mcpmux to exit). Raises `OSError` when the command cannot be run.
    """
    # As in asyncio's own subprocess start: the spawn runs on the loop, nothing waits for the child.
    child = subprocess.Popen(  # noqa: ASYNC220
        [command, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=get_default_environment() | env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=children.dies_with_us(),  # it only asks the kernel: no lock taken after fork
    )
    children.started(child)
    stderr.started()
    assert child.stdin is not None
    assert child.stdout is not None
    assert child.stderr is not None
    errors = child.stderr
    stdin, stdout = LineWriter(child.stdin), child.stdout
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def send(message: dict[str, Any], headers: dict[str, str] | None) -> None:
        try:
            await stdin.write(line(message))
        except OSError:
            raise anyio.BrokenResourceError from None

    def send_now(message: dict[str, Any], headers: dict[str, str] | None) -> bool:
        return stdin.write_now(line(message))

    lane.attach(send, send_now)

    def lanes(line: str) -> bool:
        return LANE_ID_MARK in line and lane.take(_raw(line))

    # Both pipes are read until the child is stopped, even when the task that owns the connection is
    # cancelled (shutdown, a reload): a pipe closed under a child still flushing its last answer
    # broke it (a BrokenPipeError traceback from every SDK server, on every `mcpmux tools`).
    reading_out, reading_err = anyio.CancelScope(shield=True), anyio.CancelScope(shield=True)
    hung_up = anyio.Event()  # the child closed its stdout: it is ending on its own

    async def read() -> None:
        with reading_out:
            async with to_session:
                delivering = True
                # The lane's lines are taken in the read callback itself; the rest come here, in order.
                async for line in read_lines(stdout, offer=lanes):
                    if not delivering or not line.strip():
                        continue  # once the session is gone, the rest is drained so the child can flush and exit
                    lane.passed_on()
                    try:
                        await to_session.send(_parse(line))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        delivering = False
                hung_up.set()

    writing, written, stderr_read = anyio.CancelScope(), anyio.Event(), anyio.Event()

    async def read_stderr() -> None:
        try:
            with reading_err:
                await stderr.pump(errors)
        finally:
            stderr_read.set()

    async def write() -> None:
        try:
            with writing:
                async with from_session:
                    async for item in from_session:
                        await stdin.write(item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n")
        except (OSError, anyio.ClosedResourceError):
            await to_session.aclose()  # the child stopped reading: the session must see the end
        finally:
            written.set()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read)
            tasks.start_soon(write)
            tasks.start_soon(read_stderr)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    read_stream.close()
                    write_stream.close()  # the writer flushes what it took, then ends
                    with anyio.move_on_after(_FLUSH_TIMEOUT):
                        await written.wait()
                    writing.cancel()
                    stdin.close()
                    # A child ending on its own gets the time to say why; one that never got
                    # through the handshake, and still runs, has nothing to finish.
                    await _stop(child, EXIT_GRACE if spoke.is_set() or hung_up.is_set() else 0.0)
                    stderr.exit_status = child.returncode
                    with anyio.move_on_after(_STDERR_DRAIN):
                        await stderr_read.wait()
                reading_out.cancel()
                reading_err.cancel()
                tasks.cancel_scope.cancel()
    finally:
        stdin.close()
        stdout.close()
        errors.close()


def _raw(line: str) -> Any:
    try:
        return from_json(line)
    except ValueError:
        return None


def _parse(line: str) -> SessionMessage | Exception:
    """One line as the SDK's transport reads it: a message, or the parse error for the session to surface."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as err:
        logger.warning("upstream wrote a line that is not JSON-RPC: %s", err)
        return err
    return SessionMessage(message)


class _Reaping:
    """The `Process` face `terminate_posix_process_tree` reads: `pid`, and a `returncode` that reaps."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.pid = child.pid
        self._child = child

    @property
    def returncode(self) -> int | None:
        return self._child.poll()


async def _exited(child: subprocess.Popen[bytes], within: float) -> bool:
    """Whether the child exited (and is reaped) within `within` seconds; polled, as no portable event says so."""
    with anyio.move_on_after(within):
        while child.poll() is None:  # noqa: ASYNC110
            await anyio.sleep(_EXIT_POLL)
    return child.poll() is not None


async def _stop(child: subprocess.Popen[bytes], grace: float) -> None:
    """With the child's stdin closed: wait for it, then end its process group.

    The group is ended even when the child exited on its own: whatever it started and left behind
    (a server run through a shell or a launcher) goes with it, not on as an orphan.
    """
    try:
        await _exited(child, grace)
        await terminate_posix_process_tree(cast(Process, _Reaping(child)), EXIT_GRACE)
        if not await _exited(child, EXIT_GRACE):
            logger.warning("upstream process %d is still alive after SIGKILL; abandoning it", child.pid)
    finally:
        children.ended(child)
