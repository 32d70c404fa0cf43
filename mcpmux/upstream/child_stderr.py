"""What a stdio upstream writes to its stderr: passed on labelled with its name, and its last lines kept.

A child that wrote straight to mcpmux's stderr mixed its lines in unlabelled ("Starting default
(STDIO) server..." read as if mcpmux had switched to stdio), and once it died its reason was
somewhere above. Each line now goes on prefixed with the upstream's name (`[time] ...`; a JSON
object with `--log-format json`), and the last `TAIL_LINES` are kept with the exit status of the
process that wrote them, so a `down` reason can quote them and the dashboard can show them.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import IO

from mcpmux.core.logs import upstream_line
from mcpmux.wire.stdio_lines import read_lines

TAIL_LINES = 20
"""Lines kept per upstream (the dashboard shows them; a `down` reason quotes the last few)."""
QUOTED_LINES = 3
"""Lines of the tail a `down` reason quotes."""
_LINE_LIMIT = 2000  # characters kept of one line: a child that dumps a megabyte on one line stays readable


class ChildStderr:
    """One upstream's stderr, across its restarts: the last lines and the last exit status."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self.exit_status: int | None = None
        """How the last process ended: its exit code, or minus the signal that ended it; None while it runs."""
        self._written = 0  # lines the current (or last) process wrote: only these explain how it ended

    def started(self) -> None:
        """A new process runs: its predecessor's status and lines no longer describe it (the lines stay
        in `lines`, for the dashboard)."""
        self.exit_status = None
        self._written = 0

    def add(self, line: str) -> None:
        """One line the child wrote: kept, and passed on to mcpmux's stderr with the upstream's name."""
        text = line.rstrip("\r\n")[:_LINE_LIMIT]
        self.lines.append(text)
        self._written += 1
        try:
            sys.stderr.write(upstream_line(self.name, text))
            sys.stderr.flush()
        except (OSError, ValueError):  # mcpmux's own stderr is gone (closed by whoever launched it)
            pass

    async def pump(self, wire: IO[bytes]) -> None:
        """Read `wire` (the child's stderr pipe) to its end."""
        async for line in read_lines(wire):
            self.add(line)

    def tail(self, count: int = QUOTED_LINES) -> list[str]:
        """The last `count` non-blank lines of the current (or last) process."""
        own = list(self.lines)[-self._written :] if self._written else []
        return [line for line in own if line.strip()][-count:]

    def describe_exit(self) -> str:
        """How the process ended and what it said last, for a `down` reason: '' when nothing is known."""
        parts = []
        if self.exit_status is not None:
            status = self.exit_status
            parts.append(f"exited with status {status}" if status >= 0 else f"was killed by signal {-status}")
        tail = self.tail()
        if tail:
            parts.append("its stderr ended with: " + " | ".join(tail))
        return "; ".join(parts)
