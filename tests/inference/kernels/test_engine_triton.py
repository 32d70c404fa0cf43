"""Through the real engine: a tiny model's greedy output on the Triton path equals the torch path.

The Triton kernels run in the interpreter here, so the workload is a handful of tokens; it still
covers chunked prefill (extend rows next to decode rows in one step), GQA, several KV blocks per
sequence, a prefix-cache hit, and a request joining a running batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import mcpmux.inference.kernels as kernels
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.kernels import reference
from mcpmux.inference.models.loader import LoadedModel, load_model
from tests.inference.kernels.conftest import DEVICE
from tests.inference.tiny_models import build_tiny_model

SHARED = "Paged attention stores keys and values in fixed-size blocks. "
# (prompt, max_tokens, step it arrives at)
REQUESTS = [
    ("Hello", 4, 0),
    ("The capital of France is", 3, 0),
    (SHARED + "Continuous batching", 3, 0),
    (SHARED + "The quick", 3, 2),  # joins mid-run and reuses the shared prefix's cached blocks
]


def _serve(loaded: LoadedModel, path: Path) -> dict[str, list[int]]:
    config = EngineConfig(
        model=str(path), dtype="float32", device=DEVICE, block_size=4, num_blocks=64, prefill_chunk_size=8
    )
    engine = LLMEngine(config, loaded)
    tokens: dict[str, list[int]] = {}
    step = 0
    while step <= max(arrival for _, _, arrival in REQUESTS) or engine.has_unfinished():
        for i, (prompt, max_tokens, arrival) in enumerate(REQUESTS):
            if arrival == step:
                engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
        step += 1
        assert step < 200, "the engine stopped making progress"
    return tokens


def _refuse(*_: object, **__: object) -> None:
    raise AssertionError("the torch reference ran while the Triton path was forced")


@pytest.mark.slow
@pytest.mark.usefixtures("triton_backend")
def test_greedy_output_identical_on_triton_and_torch_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = build_tiny_model("llama", tmp_path / "llama")
    loaded = load_model(str(path), "float32", DEVICE)
    kernels.set_backend("torch")
    expected = _serve(loaded, path)
    assert sorted(expected) == [f"r{i}" for i in range(len(REQUESTS))]
    assert all(len(expected[f"r{i}"]) == n for i, (_, n, _) in enumerate(REQUESTS))

    kernels.set_backend("triton")
    for name in ("write_kv", "paged_attention", "rms_norm", "rotary_embedding"):
        monkeypatch.setattr(reference, name, _refuse)
    assert _serve(loaded, path) == expected
