"""The `[inference]` table of `mcpmux.toml` and each server's `[servers.X.sampling]` table.

```toml
[inference]
backend = "local"             # "local" (the default): the in-process engine, each model loaded on its
                              # first request (builtin:smollm2-135m when no [inference.models.X] table
                              # is given); "openai": a remote OpenAI-compatible server (vLLM, SGLang,
                              # TGI); "off": no inference at all
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

[inference.remote]            # used when backend = "openai"
base_url = "http://gpu-box:8000/v1"
api_key_env = "OPENAI_API_KEY"   # the NAME of the variable holding the key, never the key
model = "meta-llama/Llama-3.1-8B-Instruct"
timeout = 60.0

[servers.NAME.sampling]       # how this upstream's sampling/createMessage requests are answered
policy = "client-then-local"  # "local" | "client" | "client-then-local" | "off"
priority = 0                  # engine priority of this upstream's requests (higher runs first)
max_tokens = 1024             # cap on what the upstream may ask for
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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


class InferenceSettings(_Model):
    backend: Literal["local", "openai", "off"] = "local"
    namespace: str = "local"
    openai_api: bool = True
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    embeddings: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    remote: RemoteSettings | None = None


class SamplingSettings(_Model):
    policy: Literal["local", "client", "client-then-local", "off"] = "client-then-local"
    priority: int = 0
    max_tokens: int = Field(default=1024, ge=1)

    @property
    def asks_client(self) -> bool:
        """Whether the upstream's sampling requests go to the calling client first (`client*` policies)."""
        return self.policy in ("client", "client-then-local")
