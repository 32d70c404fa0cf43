"""`mcpmux serve --openai-only` in a child process: a real remote OpenAI-compatible server for tests of the
remote backend and the fleet (completions from its models, /embeddings from its embedding model).
`OpenAIServer` can be killed (SIGKILL, as a crash) and started again on the same port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class OpenAIServer:
    """One server process over `config`; `port` 0 picks a free port on the first start and keeps it."""

    def __init__(self, config: Path, port: int = 0, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.port = port
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[str] | None = None
        self.tail: deque[str] = deque(maxlen=40)  # its last lines on stderr

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> str:
        """Start it and wait until it listens; its /v1 URL."""
        command = [sys.executable, "-m", "mcpmux", "serve", "--openai-only", "--config", str(self.config)]
        proc = subprocess.Popen([*command, "--port", str(self.port)], stderr=subprocess.PIPE, text=True, env=self.env)
        self.process = proc
        assert proc.stderr is not None
        lines: list[str] = []
        for line in proc.stderr:
            lines.append(line)
            found = re.search(r"http://\S+:(\d+)/v1", line)
            if found:
                self.port = int(found.group(1))
                # Drained from now on, so that a chatty server never blocks on a full pipe.
                threading.Thread(target=self._drain, args=(proc,), daemon=True).start()
                return self.url
        pytest.fail(f"mcpmux serve --openai-only exited with {proc.wait()}:\n{''.join(lines)}")

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.tail.append(line)

    def kill(self) -> None:
        """Crash it (SIGKILL): connections drop mid-answer."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        """Stop it with SIGTERM; it must exit cleanly."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout=30)
        assert status == 0, f"exit status {status}; its stderr ended:\n{''.join(self.tail)}"
        self.process = None


@contextmanager
def openai_only_server(config: Path) -> Iterator[str]:
    """Serve `config`'s `[inference]` on a free port; yields the /v1 URL, then stops the server, which
    must exit cleanly."""
    server = OpenAIServer(config)
    try:
        yield server.start()
    finally:
        server.stop()
