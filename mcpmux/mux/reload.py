"""Hot reload of the config file: what a new config changes, and watching the file.

- `diff_servers` sorts the servers of two configs into added / removed / changed / unchanged
  (`ServerConfig`s compare by value); `plan_reload` says what applying a new config does, which
  `Mux.reload` carries out: removed upstreams stop, changed ones stop then start, added ones start,
  unchanged ones are not touched (same `Upstream`, same session, their calls in flight complete).
  The catalog is rebuilt and list_changed announced once, after the new upstreams have connected
  (or `startup_timeout` ran out).
- `ConfigReloader` looks at the file (mtime, size, inode) when its folder changes (inotify, see
  `mcpmux.mux.folder_events`; polled each second where that is not available) and reloads once it has
  stopped changing; SIGHUP calls `reload()` directly. An invalid file is logged and the running config kept.

A reload cancels the calls in flight on the upstreams it stops (`mcpmux.core.call_tracker`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
from pydantic import BaseModel

from mcpmux.core.config import Config, ServerConfig, load_config
from mcpmux.errors import ConfigError
from mcpmux.mux.folder_events import FolderEvents

logger = logging.getLogger(__name__)

# `[mux]` keys a reload applies at once; every other changed key (and all of `[http]`, `[inference]`)
# is reported as needing a restart. Timeouts, backoffs and env_passthrough are read by each upstream
# when it next uses them (env_passthrough: by children started from then on); shutdown_grace when
# shutdown begins.
LIVE_MUX_KEYS = frozenset(
    {
        "call_timeout",
        "startup_timeout",
        "restart_initial_backoff",
        "restart_max_backoff",
        "env_passthrough",
        "client_priorities",
        "reload",
        "shutdown_grace",
    }
)


# -- reload ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerDiff:
    """How the enabled servers of two configs differ, by name."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What a reload did: the servers it started and stopped, and the settings it could or could not apply."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    applied: tuple[str, ...] = ()
    """Setting keys applied live, e.g. `mux.call_timeout`."""
    needs_restart: tuple[str, ...] = ()
    """Setting keys that changed but take effect only when mcpmux restarts, e.g. `http.port`."""

    def summary(self) -> str:
        """One line for the log, e.g. `added delta; removed gamma; restarted beta`."""
        servers = (("added", self.added), ("removed", self.removed), ("restarted", self.changed))
        return "; ".join(f"{what} {', '.join(names)}" for what, names in servers if names) or "no server changed"


def diff_servers(old: Mapping[str, ServerConfig], new: Mapping[str, ServerConfig]) -> ServerDiff:
    """Sort server names into added, removed, changed and unchanged (configs compared by value)."""
    return ServerDiff(
        added=tuple(name for name in new if name not in old),
        removed=tuple(name for name in old if name not in new),
        changed=tuple(name for name in new if name in old and new[name] != old[name]),
        unchanged=tuple(name for name in new if name in old and new[name] == old[name]),
    )


def _changed_keys(section: str, old: BaseModel, new: BaseModel) -> list[str]:
    return [f"{section}.{key}" for key in type(old).model_fields if getattr(old, key) != getattr(new, key)]


def plan_reload(old: Config, new: Config) -> tuple[ServerDiff, ReloadReport, Config]:
    """What applying `new` over the running `old` does: the servers' diff, the report, and the config to
    run from now on (`new`, with the `[mux]` keys a reload cannot apply, and `[http]` and
    `[inference]`, kept as they run)."""
    diff = diff_servers(old.enabled_servers, new.enabled_servers)
    mux_keys = _changed_keys("mux", old.mux, new.mux)
    applied = tuple(key for key in mux_keys if key.removeprefix("mux.") in LIVE_MUX_KEYS)
    needs_restart = tuple(
        [key for key in mux_keys if key not in applied]
        + _changed_keys("http", old.http, new.http)
        + _changed_keys("inference", old.inference, new.inference)
    )
    live = {key.removeprefix("mux."): getattr(new.mux, key.removeprefix("mux.")) for key in applied}
    settings = old.mux.model_copy(update=live)
    running = new.model_copy(update={"mux": settings, "http": old.http, "inference": old.inference})
    report = ReloadReport(diff.added, diff.removed, diff.changed, diff.unchanged, applied, needs_restart)
    return diff, report, running


def log_reload(source: object, report: ReloadReport) -> None:
    logger.warning("config reloaded from %s: %s", source, report.summary())
    if report.applied:
        logger.warning("config reload applied %s", ", ".join(report.applied))
    if report.needs_restart:
        logger.warning(
            "config reload: %s changed but take effect only when mcpmux restarts; until then the old "
            "values stay in force",
            ", ".join(report.needs_restart),
        )


Signature = tuple[tuple[int, int, int] | None, ...] | None
"""The config file's and its token files' (mtime, size, inode); None while the config file is missing."""


class Reloadable(Protocol):
    """What `ConfigReloader` reloads (a `Mux`)."""

    config: Config

    async def reload(self, config: Config) -> ReloadReport: ...


class ConfigReloader:
    """Reloads a `Mux` from its config file: when the file changes and when asked (SIGHUP)."""

    def __init__(self, mux: Reloadable, path: str | Path, interval: float = 1.0) -> None:
        self.mux = mux
        self.path = Path(path)
        self.interval = interval
        self._seen = self._signature()

    async def reload(self) -> ReloadReport | None:
        """Read and apply the file now; an invalid file is logged and the running config kept (None)."""
        self._seen = self._signature()
        try:
            config = load_config(self.path)
        except ConfigError as err:
            logger.error("config reload failed, keeping the running configuration: %s", err)
            return None
        return await self.mux.reload(config)

    async def watch(self) -> None:
        """Look at the file when its folder (or a token file's) changes, or every `interval` seconds
        where folders cannot be watched; reload once a change has held still for one interval (so a
        half-written file is not read), while `[mux] reload` is true. Runs until cancelled."""
        pending: Signature = None
        events = FolderEvents.open()
        try:
            while True:
                # watches first, then the look: a change made between the two still wakes the wait
                files = {self.path, *self.mux.config.profile_token_files}
                watched = events is not None and all([events.add(folder) for folder in {f.parent for f in files}])
                pending = await self._look(pending)
                if events is not None and watched and pending is None:
                    await events.wait(files)  # asleep until one of them changes: an idle server is not woken
                else:
                    await anyio.sleep(self.interval)  # a change settling, or no inotify: polled
        finally:
            if events is not None:
                events.close()

    async def _look(self, pending: Signature) -> Signature:
        """One look at the files; returns the change still settling, if any."""
        if not self.mux.config.mux.reload:
            return pending
        now = self._signature()
        if now == self._seen or now is None:
            return None
        if now != pending:
            return now  # changed since the last look: wait one more interval for it to settle
        await self.reload()
        return None

    def _signature(self) -> Signature:
        """The file's, and its profiles' token files' (a token file changed alone reloads too)."""
        own = _stat(self.path)
        if own is None:
            return None  # mid-replace, or deleted: the running config stays until a readable file is back
        return (own, *(_stat(file) for file in self.mux.config.profile_token_files))


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)
