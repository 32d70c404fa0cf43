"""Engine and per-request settings, validated up front with errors a user can act on."""

from __future__ import annotations

from dataclasses import dataclass

from mcpmux.inference.errors import InvalidSettingError


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidSettingError(message)


GRAMMAR_KINDS = ("json_schema", "regex", "lark")


@dataclass(slots=True, frozen=True)
class Grammar:
    """What a constrained request's output must match: a JSON schema (as JSON text), a regex or a Lark grammar."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        _check(self.kind in GRAMMAR_KINDS, f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    `temperature=0` is greedy. `top_k=0`, `top_p=1` and `min_p=0` switch those filters off.
    `seed` makes a request's samples reproducible whatever else shares the batch. `stop` strings end
    the output before the match (the match itself never appears). `logprobs=n` reports the sampled
    token's log-probability plus the `n` most likely tokens' (0: the sampled token's only), taken
    from the model's raw distribution before temperature, filters and grammar. `grammar` holds the
    output to a JSON schema, regex or Lark grammar (`engine.grammar`); it ends with "stop" once the
    grammar is complete.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        # Accept lists from JSON-shaped callers, store tuples so the params stay hashable and frozen.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check(self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}")
        _check(self.temperature >= 0, f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        _check(self.top_k >= 0, f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1] (0 turns it off), got {self.min_p}")
        _check(all(isinstance(s, str) and s for s in self.stop), f"stop strings must be non-empty: {self.stop}")
        _check(
            self.logprobs is None or 0 <= self.logprobs <= 20,
            f"logprobs must be between 0 and 20 (or None), got {self.logprobs}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(slots=True)
class EngineConfig:
    """What the engine loads and how it schedules.

    KV pool: `num_blocks` blocks of `block_size` tokens, or, when `num_blocks` is None, as many as
    `kv_cache_memory_mb` holds. A step computes at most `max_num_batched_tokens` tokens over at most
    `max_num_seqs` running requests; a prompt is prefilled in chunks of at most `prefill_chunk_size`
    tokens so it never stalls decoding. `max_waiting` bounds the waiting queue (more is rejected).
    Priority aging: a request's effective priority is `priority + steps_waited // aging_interval`
    (larger runs first), so a waiting request overtakes any fresh request of a priority up to `k`
    levels above it after `k * aging_interval` steps. On CUDA, decode steps replay captured CUDA
    graphs (`mcpmux.inference.engine.cuda_graphs`) unless `cuda_graphs` is False. With
    `jump_forward`, tokens a request's grammar forces are appended without sampling them (`engine.grammar`).
    On CPU a step runs on `cpu_threads` intra-op threads; 0 (the default) chooses them before steps from
    the cores other processes leave free, up to torch's thread count (`engine.cpu_threads`).
    """

    model: str
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_mb: int = 512
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    prefill_chunk_size: int = 256
    max_waiting: int = 1024
    enable_prefix_caching: bool = True
    aging_interval: int = 64
    max_model_len: int | None = None
    cuda_graphs: bool = True
    jump_forward: bool = True
    cpu_threads: int = 0

    def __post_init__(self) -> None:
        _check(self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}")
        _check(
            self.num_blocks is None or self.num_blocks >= 1,
            f"num_blocks must be >= 1 (or None to size from kv_cache_memory_mb), got {self.num_blocks}",
        )
        _check(self.kv_cache_memory_mb >= 1, f"kv_cache_memory_mb must be >= 1, got {self.kv_cache_memory_mb}")
        _check(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        _check(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        _check(self.prefill_chunk_size >= 1, f"prefill_chunk_size must be >= 1, got {self.prefill_chunk_size}")
        _check(self.max_waiting >= 1, f"max_waiting must be >= 1, got {self.max_waiting}")
        _check(self.cpu_threads >= 0, f"cpu_threads must be >= 0 (0: from the free cores), got {self.cpu_threads}")
        _check(self.aging_interval >= 1, f"aging_interval must be >= 1 step, got {self.aging_interval}")
        _check(
            self.max_model_len is None or self.max_model_len >= 2,
            f"max_model_len must be >= 2 (or None for the model's own), got {self.max_model_len}",
        )
