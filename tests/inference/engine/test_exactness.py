"""The core proof: fp32 greedy output of the engine equals HF `generate` token for token, for every
request of a mixed batch arriving at different steps, for tiny Llama, Qwen2 and Mistral, with small
prefill chunks, prefix-cache hits and a KV pool so small that requests get preempted."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.models.loader import LoadedModel, load_model
from tests.inference.engine_harness import (
    MAX_TOKENS,
    PROMPTS,
    Reference,
    drive,
    engine_config,
    greedy_params,
    hf_reference,
)

ARCHS = ["llama", "qwen2", "mistral"]


@pytest.fixture(scope="module", params=ARCHS)
def arch_setup(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path]) -> tuple[Path, LoadedModel, Reference]:
    path = tiny_model_dirs[request.param]
    return path, load_model(str(path), dtype="float32", device="cpu"), hf_reference(path)


def assert_matches_hf(run_tokens: dict[str, list[int]], run_texts: dict[str, str], ref: Reference) -> None:
    for i in range(len(PROMPTS)):
        assert run_tokens[f"r{i}"] == ref.outputs[i], f"request r{i} ({PROMPTS[i]!r}) differs from HF"
        assert run_texts[f"r{i}"] == ref.texts[i]


@pytest.mark.slow
def test_mixed_batch_with_small_chunks_and_prefix_hits_equals_hf(
    arch_setup: tuple[Path, LoadedModel, Reference],
) -> None:
    path, loaded, ref = arch_setup
    config = engine_config(path, num_blocks=256, prefill_chunk_size=5, max_num_batched_tokens=24, max_num_seqs=8)
    run = drive(loaded, config, greedy_params())
    assert len(PROMPTS) >= 16
    assert_matches_hf(run.tokens, run.texts, ref)
    stats = run.engine.stats()
    assert stats.cached_prompt_tokens > 0, "the shared prefixes should have hit the prefix cache"
    assert max(run.cached.values()) >= 16
    assert stats.mean_seqs_per_step > 1, "requests should have shared steps"
    assert stats.kv_usage == 0.0
    for i, out in enumerate(ref.outputs):
        expected = "length" if len(out) == MAX_TOKENS[i] and out[-1] not in loaded.eos_token_ids else "stop"
        assert run.finish[f"r{i}"] == expected


@pytest.mark.slow
def test_mixed_batch_under_preemption_equals_hf(arch_setup: tuple[Path, LoadedModel, Reference]) -> None:
    path, loaded, ref = arch_setup
    # 14 blocks of 8 tokens: the largest request needs 13, the whole mix several times more.
    config = engine_config(path, num_blocks=14, prefill_chunk_size=16, max_num_batched_tokens=48)
    run = drive(loaded, config, greedy_params())
    assert_matches_hf(run.tokens, run.texts, ref)
    stats = run.engine.stats()
    assert stats.num_preemptions > 0, "the pool was meant to be too small for the mix"
    assert stats.kv_usage == 0.0
    bm = run.engine.scheduler.block_manager
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_llama: Path) -> None:
    loaded = load_model(str(tiny_llama), dtype="float32", device="cpu")
    sampled = SamplingParams(max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=1234)
    alone = {"r0": sampled, **{f"r{i}": SamplingParams(max_tokens=1, temperature=0.0) for i in range(1, 18)}}
    crowd = {f"r{i}": SamplingParams(max_tokens=10, temperature=1.0, seed=i) for i in range(18)}
    crowd["r0"] = sampled
    config = engine_config(tiny_llama, num_blocks=256, prefill_chunk_size=7, max_num_batched_tokens=32)
    first = drive(loaded, config, alone)
    second = drive(loaded, config, crowd)
    assert first.tokens["r0"] == second.tokens["r0"]
    assert first.texts["r0"] == second.texts["r0"]
    other_seed = {**alone, "r0": SamplingParams(max_tokens=12, temperature=0.9, top_k=40, top_p=0.95, seed=99)}
    assert drive(loaded, config, other_seed).tokens["r0"] != first.tokens["r0"]
