"""Greedy decoding gives the same tokens for a prompt whatever it is served with: alone, in a batch of 64, after a
prefix-cache hit, prefilled in small chunks, and before or after the fused CPU kernels are built (the default
precision, bfloat16 on AMX and AVX512-BF16 CPUs; `cpu_fused.batch_invariant`). Real kernels built with gcc, real
models: a tiny random one under a property test (random prompts, companions and chunk sizes; its logits are near
ties, so any difference in arithmetic shows in its tokens and log-probabilities), in bfloat16 and in float32 (which
is invariant too on AVX-512 CPUs), and SmolLM2-135M-Instruct as a user runs it."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine, Prompt
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models.loader import LoadedModel, load_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="needs a C++ compiler (gcc)"),
]

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def kernels_built() -> Iterator[None]:
    assert cpu_fused.batch_invariant(), "MCPMUX_BATCH_INVARIANT=0 is set: these tests check the default"
    assert cpu_fused.enable(wait=True) is not None, "the fused CPU kernels did not build"
    yield
    cpu_fused.disable()


def _engine(loaded: LoadedModel, **config: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model="unused", device="cpu", block_size=8, **config), loaded)  # type: ignore[arg-type]


Served = tuple[list[int], list[float], int]  # tokens, their log-probabilities, cached prompt tokens


def _serve(
    loaded: LoadedModel, prompts: dict[str, Prompt], params: SamplingParams, **config: object
) -> dict[str, Served]:
    """Every prompt served by a fresh engine, all added before its first step."""
    engine = _engine(loaded, **config)
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, params)
    return _drain(engine, list(prompts))


def _one(engine: LLMEngine, rid: str, prompt: Prompt, params: SamplingParams) -> Served:
    engine.add_request(rid, prompt, params)
    return _drain(engine, [rid])[rid]


def _drain(engine: LLMEngine, rids: list[str]) -> dict[str, Served]:
    tokens: dict[str, list[int]] = {rid: [] for rid in rids}
    logprobs: dict[str, list[float]] = {rid: [] for rid in rids}
    cached: dict[str, int] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
            logprobs[out.request_id] += [lp.logprob for lp in out.logprobs]
            if out.finished:
                cached[out.request_id] = out.cached_prompt_tokens
    return {rid: (tokens[rid], logprobs[rid], cached[rid]) for rid in rids}


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def tiny(request: pytest.FixtureRequest, kernels_built: None, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A tiny random Llama whose products fit the packed layout (sides multiples of 32), head size 32: in bfloat16
    (the default precision) and in float32, which is invariant too where its products run on that layout (AVX-512:
    `cpu_fused.packed_f32`; its attention is the kernels' at every length there, `kernels.direct_pairs`)."""
    from tests.inference.tiny_models import build_tiny_model

    if request.param == "float32" and not cpu_fused.packed_f32():
        pytest.skip("no AVX-512 here: float32 products above FUSED_ROWS rows go to MKL or oneDNN, not invariant")
    overrides = {"hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 256}
    folder = build_tiny_model("llama", tmp_path_factory.mktemp(f"tiny_{request.param}") / "llama", overrides=overrides)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(cpu_fused.ENV_VAR, "fused")
        return load_model(str(folder), request.param, "cpu")


GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 600), chunk=st.integers(1, 48))
@example(seed=0, length=500, chunk=7)  # a second 256-token chunk over 500 keys: longer than DIRECT_PAIRS
def test_a_prompts_greedy_tokens_do_not_depend_on_what_it_is_served_with(
    tiny: LoadedModel, seed: int, length: int, chunk: int
) -> None:
    rng = random.Random(seed)
    vocab = tiny.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(length)]
    alone = _serve(tiny, {"p": prompt}, GREEDY)["p"]

    others = {f"o{i}": [rng.randrange(vocab) for _ in range(rng.randint(1, 120))] for i in range(63)}
    batch = _serve(tiny, {**others, "p": prompt}, GREEDY, max_num_seqs=64, max_num_batched_tokens=2048)["p"]

    chunked = _serve(tiny, {"p": prompt}, GREEDY, prefill_chunk_size=chunk, max_num_batched_tokens=chunk)["p"]

    # The prefix-cache hit: a first request leaves the prompt's whole blocks cached, the second extends them.
    engine = _engine(tiny)
    _one(engine, "first", [*prompt, rng.randrange(vocab)], GREEDY)
    hit = _one(engine, "again", prompt, GREEDY)
    assert length < 9 or hit[2] > 0, "the second request did not hit the prefix cache"

    for name, run in (("in a batch of 64", batch), ("chunked", chunked), ("after a prefix hit", hit)):
        assert run[0] == alone[0], f"greedy tokens {name} differ from alone"
        assert run[1] == alone[1], f"log-probabilities {name} differ from alone"


SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in at most one short sentence."}
ASKS = ["Name three colors.", "What is the capital of France?", "Write a haiku about the sea.", "Count to five."]
TOPICS = ["rivers", "cats", "databases", "the moon", "bread", "chess", "volcanoes", "trains"]


def _chat(text: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": text}]


@pytest.fixture(scope="module")
def smollm2_default(kernels_built: None, smollm2_cache_dir: Path) -> Iterator[LoadedModel]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MCPMUX_CACHE_DIR", str(smollm2_cache_dir))
        yield load_model("builtin:smollm2-135m")  # dtype auto: the default precision


SMOLLM2_GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def test_smollm2_default_precision_answers_the_same_alone_batched_chunked_and_after_a_prefix_hit(
    smollm2_default: LoadedModel,
) -> None:
    if cpu_fused.packed_bf16():
        assert smollm2_default.dtype == torch.bfloat16, "the default precision on an AMX or AVX512-BF16 CPU is bfloat16"
    asks = {f"a{i}": _chat(ask) for i, ask in enumerate(ASKS)}
    alone = {rid: _serve(smollm2_default, {rid: chat}, SMOLLM2_GREEDY)[rid][0] for rid, chat in asks.items()}
    assert all(len(tokens) > 3 for tokens in alone.values())

    crowd = {f"c{i}": _chat(f"Tell me one fact about {TOPICS[i % 8]}, number {i}.") for i in range(64 - len(asks))}
    batch = _serve(smollm2_default, {**crowd, **asks}, SMOLLM2_GREEDY, max_num_seqs=64)
    chunked = _serve(smollm2_default, asks, SMOLLM2_GREEDY, prefill_chunk_size=5, max_num_batched_tokens=24)
    # Every ask after the first shares the system message's whole blocks with the one before it.
    engine = _engine(smollm2_default)
    after_hit = {rid: _one(engine, rid, chat, SMOLLM2_GREEDY) for rid, chat in asks.items()}
    assert all(served[2] > 0 for served in list(after_hit.values())[1:])

    for rid in asks:
        assert batch[rid][0] == alone[rid], f"{ASKS[int(rid[1:])]!r} in a batch of 64"
        assert chunked[rid][0] == alone[rid], f"{ASKS[int(rid[1:])]!r} prefilled 5 tokens at a time"
        assert after_hit[rid][0] == alone[rid], f"{ASKS[int(rid[1:])]!r} after a prefix hit"


FRESH_START = textwrap.dedent(
    """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from mcpmux.inference.engine.config import EngineConfig, SamplingParams
    from mcpmux.inference.engine.llm_engine import LLMEngine
    engine = LLMEngine(EngineConfig(model="builtin:smollm2-135m", device="cpu"))
    params = SamplingParams(max_tokens=24, temperature=0.0)
    asks = json.loads(sys.argv[1])
    for i, ask in enumerate(asks):
        engine.add_request(str(i), ask, params)
    tokens = {str(i): [] for i in range(len(asks))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
    print(json.dumps([tokens[str(i)] for i in range(len(asks))]))
    """
)


def test_a_fresh_install_answers_as_it_will_once_the_kernels_are_built(
    smollm2_default: LoadedModel, smollm2_cache_dir: Path, tmp_path: Path
) -> None:
    """A first start with no kernels built yet (an empty extensions folder) gives the answers of a process whose
    kernels were built long before: its first step waits for the build instead of answering with the torch kernels."""
    import json

    asks = [_chat(ask) for ask in ASKS[:2]]
    want = [_serve(smollm2_default, {"x": chat}, SMOLLM2_GREEDY)["x"][0] for chat in asks]
    env = dict(
        os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "empty"), MCPMUX_CACHE_DIR=str(smollm2_cache_dir),
        PYTHONPATH=str(REPO), PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )  # fmt: skip
    fresh = subprocess.run(
        [sys.executable, "-c", FRESH_START, json.dumps(asks)],
        env=env, capture_output=True, text=True, timeout=1200, check=False, cwd=REPO,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "waiting for the fused CPU kernels' build before the first step" in fresh.stderr
    assert "building C++ extension" in fresh.stderr
    assert json.loads(fresh.stdout.splitlines()[-1]) == want
