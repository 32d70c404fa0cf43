"""Secrets on disk, one JSON file per (name, URL), safe for several processes at once.

    $MCPMUX_HOME/oauth/NAME-<hash of URL>.json     mode 0600, in a folder of mode 0700
    $MCPMUX_HOME/oauth/NAME-<hash of URL>.lock     what `locked` holds (fcntl)

A record is written whole (a temporary file renamed over the old one), so a reader never sees half
of one. `locked` is held across a read-refresh-write: a second process waiting on it then re-reads
the record the first one wrote instead of refreshing again. Nothing here logs a record's content.
Generic: imports nothing else of mcpmux.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

logger = logging.getLogger(__name__)

LOCK_POLL = 0.02
"""Seconds between tries of a lock another process (or task) holds."""


def default_home() -> Path:
    """`$MCPMUX_HOME`, else the user's data folder (`$XDG_DATA_HOME/mcpmux`, `~/.local/share/mcpmux`;
    `~/Library/Application Support/mcpmux` on macOS)."""
    if os.environ.get("MCPMUX_HOME"):
        return Path(os.environ["MCPMUX_HOME"]).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "mcpmux"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "mcpmux"


class TokenStore:
    """The records under `root` (a folder of their own, created owner-only on first write)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def file(self, name: str, url: str) -> Path:
        """Where the record of server `name` at `url` lives: a server renamed or moved starts afresh."""
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]
        digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
        return self.root / f"{slug}-{digest}.json"

    def load(self, name: str, url: str) -> dict[str, Any] | None:
        """The stored record; None when there is none, or when it is unreadable (the caller then
        needs a new one, as if none had been written)."""
        path = self.file(name, url)
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            logger.warning("token store: cannot read %s (%s); a new login will replace it", path, type(err).__name__)
            return None
        return data if isinstance(data, dict) else None

    def version(self, name: str, url: str) -> int | None:
        """Changes whenever the record is written or removed (by any process): when to read it again."""
        try:
            return os.stat(self.file(name, url)).st_mtime_ns
        except FileNotFoundError:
            return None

    def save(self, name: str, url: str, record: dict[str, Any]) -> None:
        """Write the record, readable by its owner only."""
        path = self._prepared(name, url)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(json.dumps(record, indent=1).encode("utf-8"))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def delete(self, name: str, url: str) -> bool:
        """Remove the record; False when there was none."""
        try:
            self.file(name, url).unlink()
        except FileNotFoundError:
            return False
        return True

    @contextlib.asynccontextmanager
    async def locked(self, name: str, url: str) -> AsyncIterator[None]:
        """Hold the record's lock: one holder at a time, across processes and tasks alike (each
        holder opens the lock file anew, and fcntl locks of separate opens exclude each other)."""
        path = self._prepared(name, url).with_suffix(".lock")
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await anyio.sleep(LOCK_POLL)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def _prepared(self, name: str, url: str) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        return self.file(name, url)
