"""The stdio upstreams' child processes this process runs, so that a signal can end them all at once.

Each stdio transport ends its own child as it closes (`stdio_transport`): stdin closed, a grace,
SIGTERM to the child's process group, a grace, SIGKILL. That takes up to four seconds for a child
that ignores its stdin closing (server-pdf keeps a 60 s timer), and a client may give mcpmux less:
the TypeScript SDK closes mcpmux's stdin, sends SIGTERM two seconds later and SIGKILL two seconds
after that. Each child runs in a session of its own (a terminal's Ctrl-C reaches mcpmux alone), so
a child mcpmux did not end outlives it with no parent. A signal that arrives while mcpmux is
shutting down therefore calls `hurry`: every child's group gets SIGTERM at once, and SIGKILL
`HURRY_GRACE` seconds later if it is still there.

Where mcpmux is killed outright (SIGKILL, the OOM killer), nothing of it runs to end them: on Linux
each child asks the kernel, before it runs its command, for SIGKILL when mcpmux dies
(`PR_SET_PDEATHSIG`, `dies_with_us`); a grandchild whose stdin is mcpmux's pipe reads its end.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import suppress

import anyio

logger = logging.getLogger(__name__)

HURRY_GRACE = 1.0
"""Seconds a hurried child has between SIGTERM and SIGKILL: well inside the TypeScript SDK's two."""

_running: set[subprocess.Popen[bytes]] = set()

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def dies_with_us() -> Callable[[], None] | None:
    """A `preexec_fn` for a child that must not outlive this process, however it ends (None off Linux)."""
    if _libc is None:
        return None
    libc, parent = _libc, os.getpid()

    def in_the_child() -> None:  # after fork, before exec: nothing here may take a lock
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # died before the request was made: it would never come
            os.kill(os.getpid(), signal.SIGKILL)

    return in_the_child


def started(child: subprocess.Popen[bytes]) -> None:
    """A child in a session of its own (its pid is its process group's id), until `ended`."""
    _running.add(child)


def ended(child: subprocess.Popen[bytes]) -> None:
    """The child's transport has ended it, its group with it."""
    _running.discard(child)


async def hurry() -> None:
    """End every running child's process group now: SIGTERM, and SIGKILL after `HURRY_GRACE` seconds
    for the groups still there. The transports' own shutdown carries on meanwhile (and reaps them)."""
    children = list(_running)
    if not children:
        return
    logger.warning("ending %d upstream process(es) now: SIGTERM, SIGKILL in %.0f s", len(children), HURRY_GRACE)
    for child in children:
        _signal_group(child, signal.SIGTERM)
    await anyio.sleep(HURRY_GRACE)
    for child in children:
        if child in _running:
            _signal_group(child, signal.SIGKILL)


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    # The group outlives its leader while members remain: signalled whether or not the leader exited.
    # Its transport keeps it registered until it has ended the group, so the id is not yet reused.
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signum)
