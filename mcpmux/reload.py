"""Lifecycle: hot reload of the config file, per-upstream lifetimes, and the in-flight call tracker.

- `diff_servers` sorts the servers of two configs into added / removed / changed / unchanged
  (`ServerConfig`s compare by value); `reload_mux` applies a new config to a running `Mux`: removed
  upstreams stop, changed ones stop then start, added ones start, unchanged ones are not touched (same
  `Upstream`, same session, their calls in flight complete). The catalog is rebuilt and list_changed
  announced once, after the new upstreams have connected (or `startup_timeout` ran out).
- `ConfigReloader` polls the file (mtime, size, inode) and reloads once it has stopped changing; SIGHUP
  calls `reload()` directly. An invalid file is logged and the running config kept.
- `CallTracker` knows every client call in flight: `drain()` lets them finish within the shutdown
  grace and cancels the rest, each with an error that says why; a reload cancels the calls of the
  upstreams it stops.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus
from pydantic import BaseModel

from mcpmux.config import Config, ServerConfig, load_config
from mcpmux.errors import ConfigError, UpstreamUnavailableError

if TYPE_CHECKING:
    from mcpmux.dispatch import UpstreamDispatcher
    from mcpmux.mux import Mux
    from mcpmux.upstream import Upstream

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
# How long cancelled calls get to unwind and send their error before shutdown goes on without them.
_UNWIND_SECONDS = 5.0


class CallCancelledError(UpstreamUnavailableError):
    """mcpmux cancelled the call (shutdown past its grace period, or its upstream stopped by a reload)."""


# -- in-flight calls -------------------------------------------------------------------------------


class TrackedCall:
    """One client call in flight: a cancel scope mcpmux can cancel with a reason (a sync context manager).

    Entering raises `CallCancelledError` when new calls are refused (shutting down, or the upstream is
    being restarted by a reload); leaving a call that mcpmux cancelled raises `CallCancelledError`
    with the reason, in place of the cancellation or of the error the cancellation caused.
    """

    __slots__ = ("_reason", "_scope", "_tracker", "upstream")

    def __init__(self, tracker: CallTracker, upstream: str | None) -> None:
        self._tracker = tracker
        self.upstream = upstream
        self._scope = anyio.CancelScope()
        self._reason: str | None = None

    def cancel(self, reason: str) -> None:
        """Cancel the call; its caller gets `CallCancelledError(reason)`."""
        self._reason = reason
        self._scope.cancel()

    def __enter__(self) -> None:
        self._tracker._admit(self)
        self._scope.__enter__()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            swallowed = self._scope.__exit__(exc_type, exc, tb)
        finally:
            self._tracker._release(self)
        # The scope swallows only our own cancellation, which always has a reason. An outer cancellation
        # (the client's, or the Mux closing) is not ours to turn into an error.
        if self._reason is not None and exc_type is not None and (swallowed or issubclass(exc_type, Exception)):
            raise CallCancelledError(self._reason) from None


class CallTracker:
    """The client calls in flight, so that shutdown can wait for them and a reload can cancel some."""

    def __init__(self) -> None:
        self._calls: set[TrackedCall] = set()
        self._idle = anyio.Event()
        self._idle.set()
        self._refusing: dict[str | None, str] = {}  # upstream (None: every call) -> why new calls are refused

    def track(self, upstream: str | None = None) -> TrackedCall:
        """A context manager around one call (to `upstream`, or to a local tool when None)."""
        return TrackedCall(self, upstream)

    def refuse(self, upstream: str | None, reason: str) -> None:
        """Refuse new calls to `upstream` (every call when None) and cancel those in flight, with `reason`."""
        self._refusing[upstream] = reason
        for call in list(self._calls):
            if upstream is None or call.upstream == upstream:
                call.cancel(reason)

    def admit(self, upstream: str) -> None:
        """Accept calls to `upstream` again."""
        self._refusing.pop(upstream, None)

    async def drain(self, grace: float, skip: anyio.Event | None = None) -> int:
        """Refuse new calls, wait up to `grace` seconds (or until `skip` is set) for those in flight, then
        cancel the rest with an error that says so; returns how many were cancelled."""
        self._refusing[None] = "mcpmux is shutting down and accepts no new calls"
        if self._calls:
            logger.warning("shutting down: waiting up to %g s for %d call(s) in flight", grace, len(self._calls))
            with anyio.move_on_after(grace):
                await _first_of(self._idle, skip or anyio.Event())
        late = list(self._calls)
        if skip is not None and skip.is_set():
            why = "mcpmux is shutting down: the call was cancelled (a second signal cut the grace period short)"
        else:
            why = f"mcpmux is shutting down: the call was cancelled after the {grace:g} s grace period"
        for call in late:
            call.cancel(why)
        if late:
            logger.warning("shutting down: cancelled %d call(s) still in flight", len(late))
            with anyio.move_on_after(_UNWIND_SECONDS):
                await self._idle.wait()
        return len(late)

    def _admit(self, call: TrackedCall) -> None:
        if self._refusing:
            reason = self._refusing.get(None) or self._refusing.get(call.upstream)
            if reason is not None:
                raise CallCancelledError(reason)
        if not self._calls:
            self._idle = anyio.Event()
        self._calls.add(call)

    def _release(self, call: TrackedCall) -> None:
        self._calls.discard(call)
        if not self._calls:
            self._idle.set()


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tasks:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tasks.cancel_scope.cancel()

        for event in events:
            tasks.start_soon(wait, event)


# -- per-upstream lifetimes ------------------------------------------------------------------------


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
        pending: tuple[int, int, int] | None = None
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

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None  # mid-replace, or deleted: the running config stays until a readable file is back
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)
