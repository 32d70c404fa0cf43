"""Per-upstream scheduling settings in `mcpmux.toml`: limits, priorities, caching, list-form batching.

```toml
[servers.weather.limits]        # calls beyond these wait in a priority queue (see README, Scheduling)
max_concurrency = 16            # calls in flight on the upstream at once (default: no cap)
rate = 20.0                     # calls per second (token bucket); 0 = no rate limit
burst = 5                       # calls allowed back to back after an idle period
max_queue = 256                 # calls waiting at once; beyond it `on_full` applies
on_full = "reject"              # "reject": fail at once, naming the limit; "delay": wait for room
queue_timeout = 30.0            # seconds a call may wait for its turn before it fails
aging_interval = 1.0            # seconds of waiting worth one priority level (nothing starves)

[servers.weather.priorities]    # tool glob -> priority (higher runs first); first match wins
"get_*" = 5

[servers.weather.cache]         # nothing is cached unless named here (annotations never are enough)
allow = ["get_forecast"]        # cache these tools' results
deny = ["get_secret*"]          # never cache nor share these, not even in flight (wins over allow)
ttl = 30.0                      # seconds a cached result lives
scope = "shared"                # "client": each client has its own entries (private data)

[[servers.weather.batch]]       # concurrent get_weather calls become one get_weather_many call
tool = "get_weather"
batch_tool = "get_weather_many"
argument = "location"           # the single form's argument that varies ...
list_argument = "locations"     # ... passed in order as this list to the batch form

[servers.weather.elicitation]   # the upstream's elicitation/create (form and url modes)
policy = "client"               # "client": the client whose call caused it; "decline": always declined
timeout = 300.0                 # seconds the client has to answer before the upstream gets an error

[servers.weather]
roots = ["file:///home/me/project"]   # answers roots/list when no client's roots apply ([mux] roots too)
max_result_bytes = { get_history = 400000, "*" = 50000 }   # or one number; 0: never cut ([mux]'s default)
```
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitSettings(_Model):
    max_concurrency: int | None = Field(default=None, ge=1)
    """None: no cap, so a client's parallel calls reach the upstream as they would directly."""
    rate: float = Field(default=0.0, ge=0)
    burst: int = Field(default=1, ge=1)
    max_queue: int = Field(default=1024, ge=1)
    on_full: Literal["reject", "delay"] = "reject"
    queue_timeout: float | None = Field(default=None, gt=0)
    """None: a call waits for its turn as long as its call timeout allows."""
    aging_interval: float = Field(default=1.0, gt=0)


class CacheSettings(_Model):
    enabled: bool = True
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    ttl: float = Field(default=30.0, gt=0)
    scope: Literal["shared", "client"] = "shared"


class ElicitationSettings(_Model):
    policy: Literal["client", "decline"] = "client"
    """`client`: forwarded to the client whose call caused it (declined when it cannot answer); `decline`: declined."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds a client has to answer a forwarded elicitation (a person reads and types)."""


class RootEntry(_Model):
    """One root mcpmux answers `roots/list` with: a `file://` URI, and a name for people."""

    uri: str
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"uri": data}
        return data

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        if value.startswith("/"):
            return Path(value).as_uri()
        if not value.startswith("file://"):
            raise ValueError(f"a root must be a file:// URI or an absolute path, got {value!r}")
        return value


class BatchForm(_Model):
    tool: str
    batch_tool: str
    argument: str
    list_argument: str
    result_key: str = "result"
    """The batch form answers with structuredContent[result_key] as a list (else one content block per item)."""
    max_batch_size: int = Field(default=32, ge=1)
    max_delay: float = Field(default=0.01, ge=0)
    mode: Literal["fixed", "adaptive"] = "adaptive"


def priority_for(priorities: dict[str, int], tool: str) -> int:
    """The priority of the first glob matching `tool`, in file order; 0 when none does."""
    return next((value for glob, value in priorities.items() if fnmatch.fnmatchcase(tool, glob)), 0)


ResultLimit = int | dict[str, int] | None
"""`[servers.X] max_result_bytes`: one limit, tool glob -> limit (first match wins), or None: `[mux]`'s."""


def result_limit_for(limit: ResultLimit, tool: str, default: int) -> int:
    """The byte limit on `tool`'s result text (0: none), from the server's setting, else `default`."""
    if isinstance(limit, int):
        return limit
    if limit:
        return next((value for glob, value in limit.items() if fnmatch.fnmatchcase(tool, glob)), default)
    return default
