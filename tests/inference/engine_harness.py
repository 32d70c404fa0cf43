"""Shared by the engine tests: a mixed workload, HF `generate` references, and a step driver."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.models.loader import LoadedModel

SHARED = "The quick brown fox jumps over the lazy dog. Paged attention stores keys and values in "
PROMPTS = [
    "Hello",
    "The capital of France is",
    SHARED + "fixed-size blocks.",
    SHARED + "memory.",
    "def add(a, b):",
    "Numbers: 0 1 2 3",
    SHARED + "a cache, and continuous batching lets requests join and leave at every step.",
    "Café, naïve, über, 日本語, emoji 😀.",
    "Continuous batching lets requests join",
    SHARED,
    "I am fine, thank you. " * 6,
    "x",
    "The capital of Italy is Rome; the capital of France is Paris; the capital of",
    SHARED + "blocks",
    "How are you today?",
    "return a + b\n" * 4,
    "Paged attention stores keys",
    "The lazy dog sleeps while the quick brown fox",
]
MAX_TOKENS = [24, 7, 30, 12, 18, 1, 25, 9, 30, 16, 5, 22, 11, 28, 14, 20, 3, 26]
ARRIVAL_STEPS = [0, 0, 0, 1, 1, 2, 3, 3, 5, 6, 8, 8, 9, 12, 15, 15, 20, 21]


@dataclass(slots=True)
class Reference:
    prompt_ids: list[list[int]]
    outputs: list[list[int]]  # HF greedy continuation per prompt, eos included when it stopped there
    texts: list[str]


def hf_reference(path: Path) -> Reference:
    """Greedy HF `generate`, one prompt at a time, fp32: the ground truth."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ref = Reference([], [], [])
    for prompt, max_tokens in zip(PROMPTS, MAX_TOKENS, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        new = out[0, ids.shape[1] :].tolist()
        ref.prompt_ids.append(ids[0].tolist())
        ref.outputs.append(new)
        ref.texts.append(tok.decode(new, skip_special_tokens=True))
    return ref


@dataclass(slots=True)
class Run:
    tokens: dict[str, list[int]]
    texts: dict[str, str]
    finish: dict[str, str]
    cached: dict[str, int]
    engine: LLMEngine


def drive(loaded: LoadedModel, config: EngineConfig, params: dict[str, SamplingParams]) -> Run:
    """Serve PROMPTS through a fresh LLMEngine, each arriving at its step; collect every delta."""
    engine = LLMEngine(config, loaded)
    run = Run({}, {}, {}, {}, engine)
    pending = sorted(range(len(PROMPTS)), key=lambda i: ARRIVAL_STEPS[i])
    step = 0
    while pending or engine.has_unfinished():
        while pending and ARRIVAL_STEPS[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", PROMPTS[i], params[f"r{i}"])
        for out in engine.step():
            run.tokens.setdefault(out.request_id, []).extend(out.token_ids)
            run.texts[out.request_id] = run.texts.get(out.request_id, "") + out.text
            if out.finished:
                assert out.finish_reason is not None
                run.finish[out.request_id] = out.finish_reason
                run.cached[out.request_id] = out.cached_prompt_tokens
        step += 1
        assert step < 2000, "the engine stopped making progress"
    return run


def greedy_params() -> dict[str, SamplingParams]:
    return {f"r{i}": SamplingParams(max_tokens=m, temperature=0.0) for i, m in enumerate(MAX_TOKENS)}


def engine_config(path: Path, **overrides: object) -> EngineConfig:
    base: dict[str, object] = {"model": str(path), "dtype": "float32", "device": "cpu", "block_size": 8}
    base.update(overrides)
    return EngineConfig(**base)  # type: ignore[arg-type]
