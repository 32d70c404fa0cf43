"""The real model: SmolLM2-135M served by the engine (a mixed, chunked batch) equals HF `generate`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models.builtin import ensure_converted
from mcpmux.inference.models.loader import load_model

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three prime numbers."}],
]
PLAIN = "The three primary colors are"


@pytest.mark.slow
@pytest.mark.timeout(900)  # seconds on a loaded 2-core machine; about 20 s on an idle one
def test_smollm2_engine_equals_hf_generate() -> None:
    loaded = load_model("builtin:smollm2-135m", dtype="float32", device="cpu")
    cpu_fused.wait()  # what a server runs once they are built (they build in the background)
    hf = AutoModelForCausalLM.from_pretrained(ensure_converted("smollm2-135m"), dtype=torch.float32).eval()
    prompts = [loaded.encode_chat(c) for c in CHATS] + [loaded.encode_prompt(PLAIN)]
    max_tokens = [10, 6, 5, 8]
    config = EngineConfig(model="builtin:smollm2-135m", num_blocks=64, prefill_chunk_size=16)
    engine = LLMEngine(config, loaded)
    for i, (ids, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=n, temperature=0.0))
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
    for i, (ids, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids) :].tolist()
        assert got[f"r{i}"] == ref, f"prompt {i} differs from HF"
    answer = loaded.tokenizer.decode(got["r0"], skip_special_tokens=True)
    assert "Paris" in answer
