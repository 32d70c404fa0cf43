"""mcpmux configuration: the `mcpmux.toml` schema and the client JSON formats users already have.

One resolved model (`Config`) comes out of every format:

- `mcpmux.toml`: `[mux]`, `[http]` and `[servers.NAME]` tables (Codex's `[mcp_servers.NAME]` too);
- Claude Desktop / Cursor / Claude Code JSON: `{"mcpServers": {"NAME": {command, args, env, cwd} | {url, headers}}}`;
- VS Code JSON: `{"servers": {"NAME": {"type": "stdio" | "http", ...}}}`.

`${VAR}` and `${VAR:-default}` in any string expand from the environment before validation; `$${`
writes a literal `${`. Every problem is reported as a `ConfigError` naming the file, the key path
and what was expected, before anything starts.

Paths in a file mean what they say wherever mcpmux was started from (as in Compose and VS Code): a
stdio server runs in the config file's folder unless its `cwd` says otherwise (a relative `cwd` is
relative to that folder), and a relative `command` with a `/` in it is made absolute against it, so
`command = ".venv/bin/server"` and `args = ["server.py"]` work when a client launches mcpmux from `/`.
A local model's path (`[inference.models.NAME] model`, `[inference.embeddings] model`) that exists
next to the file is read from there too.

`mcpmux.toml` is mcpmux's own: an unknown key is a mistake and named as one. A client's own file
(Claude Desktop, Cursor, VS Code JSON, Codex's `[mcp_servers]`) carries that client's settings too
(`globalShortcut`, `preferences`, a server's `autoApprove`): keys mcpmux does not use are left alone.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mcpmux.core.oauth_settings import AuthMode, OAuthSettings, ResourceServerSettings
from mcpmux.core.server_policy import BatchForm, CacheSettings, ElicitationSettings, LimitSettings, RootEntry
from mcpmux.errors import ConfigError
from mcpmux.inference.serving.settings import InferenceSettings, SamplingSettings

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
NonNegative = Annotated[int, Field(ge=0)]
DEFAULT_MAX_RESULT_BYTES = 50_000
"""At most 23,400 tokens of the densest real result measured (JSON with hashes, 2.14 bytes a token;
code and prose: 12,700 to 16,000), under the 25,000 tokens past which Claude Code refuses a result
whole: benchmarks/result_size.py, docs/perf.md."""
_VAR_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Model):
    """One upstream MCP server: a command to run (stdio) or a URL (streamable HTTP)."""

    transport: Literal["stdio", "http"]
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    enabled: bool = True
    allow_tools: list[str] = Field(default_factory=lambda: ["*"])
    deny_tools: list[str] = Field(default_factory=list)
    timeout: float | None = Field(default=None, gt=0)
    """Per-call timeout in seconds; None takes `[mux] call_timeout`."""
    protocol: Literal["auto", "legacy"] = "auto"
    """`auto` probes for 2026-07-28 and falls back; `legacy` forces the 2025 initialize handshake."""
    sessions: Literal["auto", "shared", "per-client"] = "auto"
    """Whether clients share one session with this server or each has its own (mcpmux.mux.sessions)."""
    limits: LimitSettings = Field(default_factory=LimitSettings)
    priorities: dict[str, int] = Field(default_factory=dict)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    batch: list[BatchForm] = Field(default_factory=list)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    elicitation: ElicitationSettings = Field(default_factory=ElicitationSettings)
    roots: list[RootEntry] | None = None
    """What `roots/list` from this upstream gets when no client's roots apply; None takes `[mux] roots`."""
    max_result_bytes: NonNegative | dict[str, NonNegative] | None = None
    """Bytes of result text a model is given (`mcpmux.core.result_limit`): one limit, or tool glob ->
    limit (first match wins); 0: never cut; None: `[mux] max_result_bytes`."""
    auth: AuthMode = "auto"
    """HTTP servers: sign in with OAuth when the server asks for it (auto), always (oauth), or never (none)."""
    oauth: OAuthSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _infer_transport(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        kind = data.pop("type", None)
        if kind in ("streamable-http", "streamableHttp", "http"):
            data.setdefault("transport", "http")
        elif kind == "stdio":
            data.setdefault("transport", "stdio")
        elif kind == "sse":
            raise ValueError("type 'sse' (the deprecated HTTP+SSE transport) is not supported: use streamable HTTP")
        elif kind is not None:
            raise ValueError(f"unknown type {kind!r}: expected 'stdio' or 'http'")
        if data.pop("disabled", False):
            data.setdefault("enabled", False)
        if "transport" not in data:
            data["transport"] = "http" if "url" in data else "stdio"
        return data

    @model_validator(mode="after")
    def _check_endpoint(self) -> ServerConfig:
        if self.command and self.url:
            raise ValueError(
                "has both 'command' and 'url': keep 'command' for a stdio server or 'url' for a streamable HTTP one"
            )
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio server needs 'command' (or give 'url' for a streamable HTTP server)")
        if self.transport == "http":
            if not self.url:
                raise ValueError("an http server needs 'url'")
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"'url' must start with http:// or https://, got {self.url!r}")
        if self.transport == "stdio" and (self.auth == "oauth" or self.oauth is not None):
            raise ValueError("'auth' and 'oauth' apply to http servers only (a stdio server's credentials go in 'env')")
        if self.auth == "none" and self.oauth is not None:
            raise ValueError("'oauth' settings with auth = \"none\": remove one of them")
        return self


class MuxSettings(_Model):
    """How upstreams are merged and supervised."""

    separator: str = "__"
    prefix_single: bool = True
    """Prefix names with the server name even when there is only one upstream."""
    call_timeout: float = Field(default=60.0, gt=0)
    startup_timeout: float = Field(default=30.0, gt=0)
    """Seconds an upstream has to start and complete its first handshake before it counts as down
    (and is retried with backoff); a call to one of its tools waits for it that long at most."""
    startup_list_wait: float = Field(default=10.0, ge=0)
    """Seconds after start during which a list request (tools/list, ...) waits for upstreams still
    starting, answered as soon as each has connected or failed; an upstream later than that joins
    the list by list_changed. The server itself answers at once."""
    restart_initial_backoff: float = Field(default=0.5, gt=0)
    restart_max_backoff: float = Field(default=30.0, gt=0)
    client_priorities: dict[str, int] = Field(default_factory=dict)
    """clientInfo name glob -> priority added to that client's calls (first match wins; default 0)."""
    cache_max_entries: int = Field(default=4096, ge=1)
    """Size of the result cache shared by all upstreams (LRU beyond it)."""
    page_size: int = Field(default=500, ge=1)
    """Items per page in the lists mcpmux serves (tools, prompts, resources, templates)."""
    env_passthrough: Literal["all", "minimal"] | list[str] = "all"
    """Parent environment given to stdio servers: everything, the SDK's minimal set, or these names/globs."""
    meta_tools: bool = True
    """Serve the meta-tools `mux_parallel`, `mux_batch` and `mux_pipeline` next to the upstream tools."""
    tool_search: Literal["auto", "on", "off"] = "auto"
    """Search mode: tools/list shows only mcpmux's own tools and `pinned_tools`; the rest are found with
    `mux_search_tools` and called with `mux_call_tool`. "auto": when more than `tool_search_threshold` tools."""
    tool_search_threshold: int = Field(default=40, ge=0)
    pinned_tools: list[str] = Field(default_factory=list)
    """Public tool name globs listed in search mode too, e.g. ["git__*", "time__get_current_time"]."""
    tool_search_expose: Literal["call", "listing"] = "call"
    """Tools `mux_search_tools` found are called with `mux_call_tool` ("call"), or also join the finding
    session's tools/list, which is told with list_changed ("listing"; 2025 sessions: a 2026 request has none)."""
    fast_path: bool = True
    """Relay plain `tools/call` requests as raw JSON-RPC, skipping the SDK's sessions (docs/guide/calls.md)."""
    reload: bool = True
    """Watch the config file and apply changes while serving (docs/guide/lifecycle.md); SIGHUP reloads either way."""
    shutdown_grace: float = Field(default=10.0, ge=0)
    """Seconds SIGTERM/SIGINT lets calls in flight finish before cancelling them."""
    sampling_round_timeout: float = Field(default=30.0, gt=0)
    """Seconds a 2026 client has to answer an input-required sampling round (docs/guide/sampling.md)."""
    roots: list[RootEntry] = Field(default_factory=list)
    """What `roots/list` from an upstream gets when no client's roots apply (`[servers.X] roots` wins)."""
    max_client_sessions: int = Field(default=32, ge=1)
    """Sessions of clients' own per server, beside the shared one (`[servers.X] sessions`)."""
    client_session_idle: float = Field(default=300.0, gt=0)
    """Seconds a session of a client's own may sit idle before it is stopped."""
    max_result_bytes: int = Field(default=DEFAULT_MAX_RESULT_BYTES, ge=0)
    """Bytes of a tool result's text a model is given; beyond it the text is cut at a clean boundary
    and the whole kept as a resource the client can read (docs/guide/calls.md). 0: never cut."""

    @field_validator("separator")
    @classmethod
    def _check_separator(cls, value: str) -> str:
        if not value or not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise ValueError("separator must be non-empty and use only A-Z a-z 0-9 _ . -")
        return value


class HttpSettings(_Model):
    """Where the streamable HTTP front end listens, and who may talk to it (docs/guide/security.md)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    path: str = "/mcp"
    auth_token_env: str | None = None
    """NAME of an environment variable holding the accepted bearer token(s), never a token itself."""
    auth_token_file: str | None = None
    """File of accepted bearer tokens, one a line (# comments); relative to the config file's folder."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host headers accepted besides loopback and the bind host: `name` (any port), `name:port`, or `*`."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Origin headers accepted besides loopback: `https://app.example.com`, `http://name:*`, or `*`."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    rate_limit: float = Field(default=0.0, ge=0)
    """Requests per second per client (its token, else its IP); 0 turns rate limiting off."""
    rate_burst: int = Field(default=100, ge=1)
    """Requests a client may send at once before `rate_limit` paces it."""
    metrics_auth: bool = True
    """Whether `/metrics` needs a bearer token like everything else (false: scrapers need none)."""
    idle_connections_per_client: int = Field(default=8, ge=0)
    """Idle keep-alive connections one client address may hold; past it (the longest idle for 0.25 s),
    a fast-path response closes its connection (`Connection: close`, mcpmux.server.http.keepalive). 0: no limit."""
    oauth: ResourceServerSettings | None = None
    """`[http.oauth]`: accept OAuth access tokens issued for this server too (docs/guide/security.md)."""

    @field_validator("auth_token_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        return _env_name(value)


def _env_name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("must be the NAME of an environment variable (letters, digits, _), not a token")
    return value


class ProfileSettings(_Model):
    """`[profiles.NAME]`: the part of the catalog a client sees when served with `mcpmux serve --profile NAME`,
    over HTTP at `/mcp/NAME`, or with one of the profile's bearer tokens.

    Globs over server names and over public tool names (`server__tool`); deny wins over allow. Tools
    outside the profile are not listed, not found by search, and unknown when called."""

    servers: list[str] = Field(default_factory=lambda: ["*"])
    deny_servers: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=lambda: ["*"])
    deny_tools: list[str] = Field(default_factory=list)
    auth_token_env: str | None = None
    """NAME of an environment variable holding bearer token(s) bound to this profile: over HTTP, a
    request with one sees only this profile, on `/mcp` or `/mcp/NAME` (any other profile's path: 403)."""
    auth_token_file: str | None = None
    """File of bearer tokens bound to this profile, one a line (# comments); relative to the config file."""

    @field_validator("auth_token_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        return _env_name(value)

    def allows_server(self, name: str) -> bool:
        return _matches(name, self.servers) and not _matches(name, self.deny_servers)

    def allows_tool(self, public_name: str) -> bool:
        return _matches(public_name, self.tools) and not _matches(public_name, self.deny_tools)


def _matches(name: str, globs: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


class Config(_Model):
    """The resolved configuration, whatever file format it came from."""

    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    mux: MuxSettings = Field(default_factory=MuxSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    inference: InferenceSettings = Field(default_factory=InferenceSettings)
    profiles: dict[str, ProfileSettings] = Field(default_factory=dict)
    source: str = "<memory>"

    @field_validator("servers")
    @classmethod
    def _check_names(cls, servers: dict[str, ServerConfig]) -> dict[str, ServerConfig]:
        for name in servers:
            if not _NAME_RE.match(name):
                raise ValueError(f"server name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
        return servers

    @field_validator("profiles")
    @classmethod
    def _check_profile_names(cls, profiles: dict[str, ProfileSettings]) -> dict[str, ProfileSettings]:
        for name in profiles:
            if not _NAME_RE.match(name):
                raise ValueError(
                    f"profile name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ . - (it is a URL path)"
                )
        return profiles

    @property
    def enabled_servers(self) -> dict[str, ServerConfig]:
        return {name: server for name, server in self.servers.items() if server.enabled}

    def path_of(self, file: str) -> Path:
        """A file the config names (a token file): `~` expanded, a relative one beside the config file."""
        path = Path(file).expanduser()
        source = Path(self.source)
        return path if path.is_absolute() or not source.is_file() else source.parent / path

    @property
    def profile_token_files(self) -> list[Path]:
        """The `[profiles.NAME] auth_token_file`s, which a reload reads again."""
        files = {profile.auth_token_file for profile in self.profiles.values() if profile.auth_token_file}
        return [self.path_of(file) for file in sorted(files)]


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> Config:
    """Read, expand and validate a config file (`.toml` or `.json`); raise `ConfigError` on any problem.

    Relative paths in it (a stdio server's `command` and `cwd`, a local model's folder or file) are
    resolved against its folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    raw = _parse(path, text)
    client_file = path.suffix == ".json" or "mcp_servers" in raw
    return config_from_dict(raw, source=str(path), environ=environ, folder=path.parent, client_file=client_file)


def config_from_dict(
    raw: dict[str, Any],
    source: str = "<memory>",
    environ: dict[str, str] | None = None,
    folder: Path | None = None,
    client_file: bool = False,
) -> Config:
    """Validate an already-parsed config in any of the accepted shapes.

    `folder`: where relative paths are resolved (the config file's folder; None leaves them to the
    process's working directory). `client_file`: the file belongs to an MCP client, whose own keys
    are skipped rather than refused."""
    env = dict(os.environ) if environ is None else environ
    data = _normalize(raw, source)
    if client_file:
        data = _only_known_keys(data)
    data = _expand(data, env, source, ())
    try:
        config = Config.model_validate({**data, "source": source})
    except ValidationError as err:
        raise ConfigError(_describe(err, source)) from None
    return config if folder is None else _resolved(config, folder.expanduser().resolve())


def _resolved(config: Config, folder: Path) -> Config:
    """`config` with its stdio servers' relative paths made absolute against `folder` (module docstring)."""
    servers = {}
    for name, server in config.servers.items():
        if server.transport == "stdio":
            # normpath, not resolve: a venv's python is a symlink that must be run by its own path.
            cwd = os.path.normpath(folder / Path(server.cwd).expanduser()) if server.cwd else str(folder)
            command = server.command or ""
            if "/" in command:
                command = os.path.normpath(folder / Path(command).expanduser())
            server = server.model_copy(update={"cwd": cwd, "command": command})
        servers[name] = server
    return config.model_copy(update={"servers": servers, "inference": _resolved_models(config.inference, folder)})


def _resolved_models(inference: InferenceSettings, folder: Path) -> InferenceSettings:
    """`[inference]` with each model given as a relative path that exists next to the file made
    absolute against `folder` (a `builtin:` name, an absolute path, or anything not found there is kept)."""

    def resolved(model: str) -> str:
        if not model or model.startswith("builtin:") or Path(model).expanduser().is_absolute():
            return model
        candidate = os.path.normpath(folder / model)
        return candidate if os.path.exists(candidate) else model

    models = {
        name: settings.model_copy(update={"model": resolved(settings.model)})
        for name, settings in inference.models.items()
    }
    embeddings = inference.embeddings.model_copy(update={"model": resolved(inference.embeddings.model)})
    return inference.model_copy(update={"models": models, "embeddings": embeddings})


def _parse(path: Path, text: str) -> dict[str, Any]:
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: invalid TOML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/object")
    return data


_SERVER_KEYS = ("servers", "mcpServers", "mcp_servers")


def _normalize(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """Fold the client formats' server tables into `servers`, keeping the rest as is."""
    present = [key for key in _SERVER_KEYS if key in raw]
    if len(present) > 1:
        raise ConfigError(f"{source}: use one of {', '.join(present)}, not several")
    data = {key: value for key, value in raw.items() if key not in _SERVER_KEYS}
    if present:
        data["servers"] = raw[present[0]]
    # VS Code files carry an "inputs" list for interactive prompts, which a server cannot answer.
    data.pop("inputs", None)
    return data


# What a server entry may say besides `ServerConfig`'s fields: the client formats' `type` and `disabled`.
_SERVER_ALIASES = frozenset({"type", "disabled"})


def _only_known_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A client's file without the keys mcpmux does not read: at the top level and in each server entry.
    mcpmux's own tables in it (`mux`, `http`, a server's `limits`) stay strict."""
    known = {key: value for key, value in data.items() if key in Config.model_fields and key != "source"}
    servers = known.get("servers")
    if isinstance(servers, dict):
        fields = ServerConfig.model_fields.keys() | _SERVER_ALIASES
        known["servers"] = {
            name: {key: value for key, value in entry.items() if key in fields} if isinstance(entry, dict) else entry
            for name, entry in servers.items()
        }
    return known


def _expand(value: Any, env: dict[str, str], source: str, path: tuple[str | int, ...]) -> Any:
    if isinstance(value, str):
        return _expand_string(value, env, source, path)
    if isinstance(value, dict):
        return {key: _expand(item, env, source, (*path, key)) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand(item, env, source, (*path, index)) for index, item in enumerate(value)]
    return value


def _expand_string(text: str, env: dict[str, str], source: str, path: tuple[str | int, ...]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        if name in env and (env[name] or default is None):
            return env[name]
        if default is not None:
            return default
        raise ConfigError(
            f"{source}: {_dotted(path)}: environment variable {name} is not set "
            f"(set it, or write ${{{name}:-default}} to give a default)"
        )

    return _VAR_RE.sub(replace, text)


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for item in err.errors():
        loc = tuple(part for part in item["loc"] if not str(part).startswith("function-"))
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check its spelling against the README's annotated example)"
        elif item["type"] == "missing":
            message = "required key is missing"
        elif "input" in item and item["type"].endswith("_type"):
            # A string may hold an expanded ${SECRET}: name its type, never echo it.
            shown = "" if isinstance(item["input"], str) else f" {item['input']!r}"
            message = f"{message}, got {type(item['input']).__name__}{shown}"
        lines.append(f"  {_dotted(loc)}: {message}")
    return "\n".join(lines)
