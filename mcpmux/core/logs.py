"""Logging set-up for the CLI, and the request id that ties a client call to its upstream call.

`configure_logging(level, "json")` writes one JSON object per line on stderr (stdout may carry MCP):

    {"ts": "2026-11-30T13:20:01.123Z", "level": "debug", "logger": "mcpmux.mux.dispatcher",
     "msg": "upstream call sent", "request_id": "3f9a1c2e", "upstream": "time", "tool": "get_current_time"}

`request_id`, `upstream` and `tool` come from a context variable that `Mux.call_tool` sets for the
duration of one client call (`RequestContext`), so every line logged while serving it, in any module,
carries them; `grep 3f9a1c2e` finds the client call and the upstream call it caused. Fields passed
with `extra=` are added to the object too.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

_request: ContextVar[RequestInfo | None] = ContextVar("mcpmux_request", default=None)

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(context)s%(message)s"
# What every LogRecord carries; anything else on a record came from `extra=` and is worth showing.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "context",
    "taskName",
    "request_id",
    "upstream",
    "tool",
}


def new_request_id() -> str:
    """A short random id (8 hex digits): unique enough to grep one call out of a day's log.

    Not a secret, so the cheap PRNG will do (`secrets` costs a system call per id).
    """
    return f"{random.getrandbits(32):08x}"


@dataclass(slots=True)
class RequestInfo:
    """What the log lines of one client call carry."""

    request_id: str
    tool: str | None = None
    upstream: str | None = None


def current_request() -> RequestInfo | None:
    """The client call this code runs for, if any."""
    return _request.get()


def set_upstream(upstream: str) -> None:
    """Name the upstream the current call was routed to (once it is resolved)."""
    info = _request.get()
    if info is not None:
        info.upstream = upstream


class RequestContext:
    """`with RequestContext(tool=..., upstream=...) as info:` labels every log line logged inside it.

    Keeps the request id already set (a meta-tool's inner calls share their client call's id) and
    otherwise makes a new one. A plain class rather than `@contextmanager`, and one context variable
    holding the three fields: it runs on every call.
    """

    __slots__ = ("_token", "tool", "upstream")

    def __init__(self, *, tool: str | None = None, upstream: str | None = None) -> None:
        self.tool = tool
        self.upstream = upstream
        self._token: Token[RequestInfo | None] | None = None

    def __enter__(self) -> RequestInfo:
        outer = _request.get()
        info = RequestInfo(outer.request_id if outer is not None else new_request_id(), self.tool, self.upstream)
        self._token = _request.set(info)
        return info

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._token is not None, "RequestContext was not entered"
        _request.reset(self._token)


class _ContextFilter(logging.Filter):
    """Copies the request context onto each record (as attributes, and as a prefix for text logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = _request.get()
        if info is None:
            record.request_id = record.upstream = record.tool = None
            record.context = ""
            return True
        record.request_id, record.upstream, record.tool = info.request_id, info.upstream, info.tool
        parts = [f"req={info.request_id}"]
        parts += [f"{key}={value}" for key, value in (("upstream", info.upstream), ("tool", info.tool)) if value]
        record.context = f"[{' '.join(parts)}] "
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, the request context, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        created = time.gmtime(record.created)
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", created) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("request_id", "upstream", "tool"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value if isinstance(value, str | int | float | bool | None) else repr(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


_format: LogFormat = "text"  # what `configure_logging` chose; upstreams' stderr lines follow it


def upstream_line(upstream: str, text: str) -> str:
    """A line a stdio upstream wrote to its stderr, as mcpmux passes it on: labelled with its name.

    Not a log record: an upstream's own output is passed on whatever mcpmux's log level, as it was
    when the child wrote to mcpmux's stderr itself; only its shape follows `--log-format`."""
    if _format == "json":
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
        entry = {"ts": ts, "level": "info", "logger": "upstream.stderr", "msg": text, "upstream": upstream}
        return json.dumps(entry, ensure_ascii=False) + "\n"
    return f"[{upstream}] {text}\n"


def configure_logging(level: str = "warning", fmt: LogFormat = "text") -> None:
    """Send the root logger to stderr at `level`, as text lines or JSON lines, with the request context.

    Replaces handlers set before (calling it twice does not double every line).
    """
    global _format
    _format = fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
