"""`mcpmux serve --openai-only` in a child process: a real remote OpenAI-compatible server for tests of the
remote backend (completions from its models, /embeddings from its embedding model)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def openai_only_server(config: Path) -> Iterator[str]:
    """Serve `config`'s `[inference]` on a free port; yields the /v1 URL, then stops the server, which
    must exit cleanly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpmux", "serve", "--openai-only", "--config", str(config), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            found = re.search(r"(http://\S+/v1)", line)
            if found:
                break
        else:
            pytest.fail(f"mcpmux serve --openai-only exited with {proc.wait()}:\n{''.join(lines)}")
        yield found.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
