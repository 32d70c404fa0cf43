"""Decode steps replayed from CUDA graphs give the tokens eager steps give (needs a GPU)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def run_all(engine: LLMEngine, prompts: list[list[int]], lengths: list[int]) -> dict[str, list[int]]:
    """Greedy tokens of every request, added together and stepped to the end."""
    for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
    return tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_graph_replayed_decode_equals_eager(arch: str, tiny_model_dirs: dict[str, Path]) -> None:
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(3, 40))] for _ in range(11)]
    lengths = [rng.randint(5, 40) for _ in prompts]  # requests leave at different steps: buckets change
    results = []
    for graphs in (False, True):
        config = EngineConfig(model=str(tiny_model_dirs[arch]), device="cuda", dtype="float32", num_blocks=256,
                              max_num_seqs=16, cuda_graphs=graphs)  # fmt: skip
        engine = LLMEngine(config)
        results.append(run_all(engine, prompts, lengths))
        if graphs:
            assert engine.runner.graphs is not None
            assert sorted(engine.runner.graphs.graphs) == [1, 2, 4, 8, 16]  # every bucket, captured at start
            assert engine.runner.graphs.replays > 0
    eager, replayed = results
    assert replayed == eager
