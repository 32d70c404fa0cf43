"""The `[inference]` table of `mcpmux.toml` and each server's `[servers.X.sampling]` table.

```toml
[inference]
backend = "local"             # "local" (the default): the in-process engine, each model loaded on its
                              # first request (builtin:smollm2-135m when no [inference.models.X] table
                              # is given); "openai": a remote OpenAI-compatible server (vLLM, SGLang,
                              # TGI); "fleet": the [[inference.backends]] (the default when they are
                              # given); "off": no inference at all
share_identical = true        # identical concurrent greedy requests share one generation
namespace = "local"           # local tools are served as local__generate and local__embed
openai_api = true             # serve the OpenAI-compatible API at /v1 on the HTTP server

[inference.models.smollm2]    # one table per model; the first is the default
model = "builtin:smollm2-135m"   # builtin:NAME, a local HF folder, or a .gguf file
dtype = "auto"
device = "auto"
max_num_seqs = 64
max_num_batched_tokens = 512
kv_cache_memory_mb = 512
max_waiting = 1024            # requests queued beyond this are refused (HTTP 503 on /v1)
cuda_graphs = true            # on CUDA, decode steps replay graphs captured at start; false: eager
intelligence = 0.2            # 0..1, matched against sampling modelPreferences priorities
speed = 0.9
cost = 0.9                    # 1 = cheapest

[inference.embeddings]
model = "builtin:all-minilm-l6-v2"   # or a local sentence-transformers folder; "" turns embeddings off
max_batch_size = 32
max_delay = 0.005
mode = "adaptive"
bucketing = true

[inference.remote]            # used when backend = "openai": one remote server, the short form
base_url = "http://gpu-box:8000/v1"
api_key_env = "OPENAI_API_KEY"   # the NAME of the variable holding the key, never the key
model = "meta-llama/Llama-3.1-8B-Instruct"
timeout = 60.0

[[inference.backends]]        # a fleet: any number of these, instead of backend/remote (backend = "fleet")
name = "gpu-a"                # how logs, errors, status and /metrics name it (default: host:port, or "local")
kind = "openai"               # "openai": an OpenAI-compatible server; "local": the in-process engine
base_url = "http://gpu-a:8000/v1"
api_key_env = "GPU_A_KEY"
models = ["llama-8b"]         # the model names it serves, or {name = "its own name for it"}; local: the
                              # [inference.models.X] names by default
weight = 1.0                  # a share of the load relative to the others (least outstanding / weight)
max_concurrency = 64          # requests in flight at once at most (none: no limit)
requests_per_second = 20.0    # a rate limit, with bursts of `burst` (none: no limit)
burst = 20
timeout = 60.0
fallback = false              # true: used only while every other backend serving the model is down
embeddings = false            # openai: serves /embeddings for [inference.embeddings] model
forward_priority = true       # send priorities as vLLM's `priority` (lower runs first) where accepted
structured_output = "auto"    # "auto": ask the server once whether it follows response_format json_schema;
                              # "json_schema": it does; "prompt": ask for the JSON in the prompt instead
down_after = 2                # failures in a row that take it out; it is probed back in
probe_interval = 2.0          # seconds between probes of a backend that is out

[servers.NAME.sampling]       # how this upstream's sampling/createMessage requests are answered
policy = "client-then-local"  # "local" | "client" | "client-then-local" | "off"
priority = 0                  # engine priority of this upstream's requests (higher runs first)
max_tokens = 1024             # cap on what the upstream may ask for
```
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSettings(_Model):
    model: str
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int = Field(default=512, ge=1)
    kv_cache_memory_mb: int = Field(default=512, ge=1)
    max_waiting: int = Field(default=1024, ge=1)
    cuda_graphs: bool = True
    intelligence: float = Field(default=0.5, ge=0, le=1)
    speed: float = Field(default=0.5, ge=0, le=1)
    cost: float = Field(default=0.5, ge=0, le=1)


class EmbeddingSettings(_Model):
    model: str = "builtin:all-minilm-l6-v2"
    max_batch_size: int = Field(default=32, ge=1)
    max_delay: float = Field(default=0.005, ge=0)
    mode: Literal["fixed", "adaptive"] = "adaptive"
    bucketing: bool = True


class RemoteSettings(_Model):
    base_url: str
    api_key_env: str | None = None
    model: str
    timeout: float = Field(default=60.0, gt=0)


class BackendSettings(_Model):
    """One backend of the fleet: the in-process engine (`local`) or an OpenAI-compatible server."""

    name: str | None = None
    kind: Literal["openai", "local"] = "openai"
    base_url: str | None = None
    api_key_env: str | None = None
    models: list[str] | dict[str, str] = Field(default_factory=list)
    weight: float = Field(default=1.0, gt=0)
    max_concurrency: int | None = Field(default=None, ge=1)
    requests_per_second: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)
    timeout: float = Field(default=60.0, gt=0)
    fallback: bool = False
    embeddings: bool = False
    forward_priority: bool = True
    structured_output: Literal["auto", "json_schema", "prompt"] = "auto"
    down_after: int = Field(default=2, ge=1)
    probe_interval: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _kind_fits(self) -> BackendSettings:
        if self.kind == "openai" and not self.base_url:
            raise ValueError(f"backend {self.label!r} (kind openai) needs a base_url, such as http://gpu-box:8000/v1")
        if self.kind == "openai" and not self.models:
            raise ValueError(f"backend {self.label!r} needs models: the names of the models it serves")
        if self.kind == "local" and (self.base_url or self.api_key_env or self.embeddings):
            raise ValueError(
                "a local backend runs in this process: base_url, api_key_env and embeddings are for kind openai"
            )
        return self

    @property
    def label(self) -> str:
        """The name logs, errors and metrics use: `name`, else the server's host:port, else "local"."""
        if self.name:
            return self.name
        if self.base_url:
            return urlsplit(self.base_url).netloc or self.base_url
        return "local"

    def model_names(self) -> dict[str, str]:
        """Each model name mcpmux serves through this backend, mapped to the backend's own name for it."""
        return {name: name for name in self.models} if isinstance(self.models, list) else dict(self.models)


class InferenceSettings(_Model):
    backend: Literal["local", "openai", "fleet", "off"] = "local"
    namespace: str = "local"
    openai_api: bool = True
    share_identical: bool = True
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    remote: RemoteSettings | None = None
    backends: list[BackendSettings] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _backends_make_a_fleet(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("backends") and "backend" not in data:
            return {**data, "backend": "fleet"}
        return data

    @model_validator(mode="after")
    def _fleet_is_consistent(self) -> InferenceSettings:
        if self.backend == "fleet" and not self.backends:
            raise ValueError('backend = "fleet" needs at least one [[inference.backends]] table')
        if not self.backends or self.backend == "off":
            return self
        if self.backend != "fleet":
            raise ValueError(
                f'[[inference.backends]] make a fleet, but backend = "{self.backend}"; set backend = "fleet" (or '
                "leave it out) to serve them, or remove them"
            )
        if self.remote is not None:
            raise ValueError(
                '[inference.remote] is the one-server form of backend = "openai"; in a fleet, give that server '
                "as one of the [[inference.backends]]"
            )
        labels = [backend.label for backend in self.backends]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"two [[inference.backends]] are named {repeated[0]!r}; give each its own name")
        local = [backend for backend in self.backends if backend.kind == "local"]
        if len(local) > 1:
            raise ValueError("one [[inference.backends]] of kind local at most: it serves every local model")
        if self.models and not local:
            raise ValueError(
                "[inference.models.*] are served by the local engine, but no [[inference.backends]] is of kind "
                '"local"; add one (kind = "local") or remove those tables'
            )
        unknown = [name for name in (local[0].model_names().values() if local else ()) if name not in self.models]
        if self.models and unknown:
            raise ValueError(
                f"the local backend serves {unknown[0]!r}, which is not an [inference.models.*] table; "
                f"configured: {', '.join(self.models)}"
            )
        return self

    def fleet(self) -> list[BackendSettings]:
        """The backends that serve: `[[inference.backends]]`, or the one the short forms describe."""
        if self.backends:
            return list(self.backends)
        if self.backend == "openai" and self.remote is not None:
            remote = self.remote
            return [
                BackendSettings(
                    base_url=remote.base_url,
                    api_key_env=remote.api_key_env,
                    models=[remote.model],
                    timeout=remote.timeout,
                    embeddings=True,
                )
            ]
        return [BackendSettings(kind="local")]


class SamplingSettings(_Model):
    policy: Literal["local", "client", "client-then-local", "off"] = "client-then-local"
    priority: int = 0
    max_tokens: int = Field(default=1024, ge=1)

    @property
    def asks_client(self) -> bool:
        """Whether the upstream's sampling requests go to the calling client first (`client*` policies)."""
        return self.policy in ("client", "client-then-local")
