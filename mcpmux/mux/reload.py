"""Lifecycle: hot reload of the config file, per-upstream lifetimes, and the in-flight call tracker.

- `diff_servers` sorts the servers of two configs into added / removed / changed / unchanged
  (`ServerConfig`s compare by value); `reload_mux` applies a new config to a running `Mux`: removed
  upstreams stop, changed ones stop then start, added ones start, unchanged ones are not touched (same
  `Upstream`, same session, their calls in flight complete). The catalog is rebuilt and list_changed
  announced once, after the new upstreams have connected (or `startup_timeout` ran out).
- `ConfigReloader` polls the file (mtime, size, inode) and reloads once it has stopped changing; SIGHUP
  calls `reload()` directly. An invalid file is logged and the running config kept.

A reload cancels the calls in flight on the upstreams it stops (`mcpmux.core.call_tracker`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus
from pydantic import BaseModel

from mcpmux.core.config import Config, ServerConfig, load_config
from mcpmux.errors import ConfigError

if TYPE_CHECKING:
    from mcpmux.mux.dispatcher import UpstreamDispatcher
    from mcpmux.mux.multiplexer import Mux
    from mcpmux.upstream.supervisor import Upstream

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


@dataclass(slots=True)
class UpstreamLifetime:
    """One upstream's supervisor and dispatcher, in a cancel scope of their own: it stops alone."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stopped: anyio.Event = field(default_factory=anyio.Event)

    @classmethod
    async def start(cls, tasks: TaskGroup, upstream: Upstream, dispatcher: UpstreamDispatcher) -> UpstreamLifetime:
        """Start `upstream.run()` and the dispatcher's tasks in `tasks`; returns once the dispatcher runs."""
        lifetime = cls()
        await tasks.start(lifetime._run, upstream, dispatcher, name=f"upstream {upstream.name}")
        return lifetime

    async def stop(self) -> None:
        """Stop the supervisor (its child process ends) and the dispatcher; returns when both have."""
        self.scope.cancel()
        await self.stopped.wait()

    async def _run(self, upstream: Upstream, dispatcher: UpstreamDispatcher, *, task_status: TaskStatus[None]) -> None:
        # Entered and left in this one task, as anyio requires of the dispatcher's task groups.
        try:
            with self.scope:
                async with AsyncExitStack() as stack:
                    await dispatcher.start(stack)
                    task_status.started()
                    await upstream.run()
        finally:
            self.stopped.set()


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


async def reload_mux(mux: Mux, new: Config) -> ReloadReport:
    """Apply `new` to the running `mux` (see the module docstring); concurrent reloads run one after another."""
    async with mux._reload_lock:
        old = mux.config
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
        mux.config = new.model_copy(update={"mux": settings, "http": old.http, "inference": old.inference})
        for upstream in mux.upstreams.values():
            upstream.settings = settings
        report = ReloadReport(diff.added, diff.removed, diff.changed, diff.unchanged, applied, needs_restart)
        if diff.added or diff.removed or diff.changed:
            await _restart_servers(mux, new, diff)
        logger.warning("config reloaded from %s: %s", new.source, report.summary())
        if applied:
            logger.warning("config reload applied %s", ", ".join(applied))
        if needs_restart:
            logger.warning(
                "config reload: %s changed but take effect only when mcpmux restarts; until then the old "
                "values stay in force",
                ", ".join(needs_restart),
            )
        return report


async def _restart_servers(mux: Mux, new: Config, diff: ServerDiff) -> None:
    # Nothing awaits between taking a removed upstream out of the dicts and its routes out of the
    # catalog, so no call routes to a missing upstream; a changed one stays in the dicts (its calls
    # refused) until its successor replaces it there.
    mux._reloading = True
    try:
        stopping: list[UpstreamLifetime] = []
        # Clients' own sessions stop with their server; a changed server's are replaced with it.
        own = [mux.sessions.pop(name) for name in diff.removed] + [mux.sessions[name] for name in diff.changed]
        for name in diff.removed:
            mux.calls.refuse(name, f"upstream {name!r} was removed by a config reload; the call was cancelled")
            stopping.append(mux._detach_upstream(name))
        mux.catalog.rebuild(mux.upstreams.values(), mux.local_tools)
        for name in diff.changed:
            mux.calls.refuse(
                name,
                f"upstream {name!r} is restarting because a config reload changed it; the call was cancelled, "
                "retry it shortly",
            )
            stopping.append(mux._lifetimes.pop(name))
        async with anyio.create_task_group() as tasks:
            for lifetime in stopping:
                tasks.start_soon(lifetime.stop)
            for sessions in own:
                tasks.start_soon(sessions.stop)
        for name in (*diff.changed, *diff.added):
            await mux._start_upstream(name, new.servers[name])
            mux.calls.admit(name)  # calls wait for the new connection, up to the upstream's timeout
        with anyio.move_on_after(mux.config.mux.startup_timeout):
            for name in (*diff.changed, *diff.added):
                await mux.upstreams[name].settled.wait()
    finally:
        mux._reloading = False
        for name in (*diff.removed, *diff.changed):
            mux.calls.admit(name)
    for name in (*diff.removed, *diff.changed, *diff.added):
        mux.cache.invalidate_tag(name)
        mux.resource_cache.invalidate_tag(name)
    await mux._catalog_changed()


class ConfigReloader:
    """Reloads a `Mux` from its config file: when the file changes (polled) and when asked (SIGHUP)."""

    def __init__(self, mux: Mux, path: str | Path, interval: float = 1.0) -> None:
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
        """Poll the file every `interval` seconds; reload once a change has held still for one interval
        (so a half-written file is not read), while `[mux] reload` is true. Runs until cancelled."""
        pending: tuple[tuple[int, int, int] | None, ...] | None = None
        while True:
            await anyio.sleep(self.interval)
            if not self.mux.config.mux.reload:
                continue
            now = self._signature()
            if now == self._seen or now is None:
                pending = None
            elif now != pending:
                pending = now  # changed since the last look: wait one more interval for it to settle
            else:
                pending = None
                await self.reload()

    def _signature(self) -> tuple[tuple[int, int, int] | None, ...] | None:
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
