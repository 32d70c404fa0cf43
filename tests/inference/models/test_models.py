"""Our Llama-family forward equals transformers' in fp32, through a real paged KV cache.

This is the ground the engine stands on: full-prompt logits, step-by-step greedy decoding and one
ragged mixed batch must all give what HF gives for the same weights.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from mcpmux.inference.models.forward_batch import ForwardBatch
from mcpmux.inference.models.llama import LlamaCausalLM
from mcpmux.inference.models.loader import LoadedModel, load_model
from tests.inference.tiny_models import TINY_ARCHS, build_tiny_model

BLOCK_SIZE = 4  # tiny, so even short prompts cross several blocks
NUM_BLOCKS = 64
PROMPTS = ["The capital of France is", "def add(a, b):", "Hello, world! How are you today?"]


@dataclass(slots=True)
class PagedSequence:
    """One sequence's tokens so far and its blocks, drawn in shuffled order from a shared pool."""

    tokens: list[int]
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V is already in the cache


@dataclass(slots=True)
class PagedCache:
    """A hand-built paged KV cache: what the engine's block manager and runner do, minus scheduling."""

    loaded: LoadedModel
    free: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def create(cls, loaded: LoadedModel, seed: int = 0) -> PagedCache:
        free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(free)
        shape = (NUM_BLOCKS, BLOCK_SIZE, loaded.num_kv_heads, loaded.head_dim)
        # NaN-poisoned: a read of any slot not written this run would poison the logits.
        nan = float("nan")
        kv = [
            (
                torch.full(shape, nan, dtype=loaded.dtype, device=loaded.device),
                torch.full(shape, nan, dtype=loaded.dtype, device=loaded.device),
            )
            for _ in range(loaded.num_layers)
        ]
        return cls(loaded, free, kv)

    def step(self, seqs: list[PagedSequence], query_lens: list[int], sample: bool = True) -> torch.Tensor:
        """Run ``query_lens[i]`` uncached tokens of each sequence in ONE forward; logits of each last row.

        ``sample=False`` asks for no logits at all, as the engine does for a step of prefill chunks only.
        """
        input_ids, positions, slots, starts, logits_rows = [], [], [], [0], []
        for seq, q_len in zip(seqs, query_lens, strict=True):
            end = seq.cached + q_len
            while len(seq.blocks) * BLOCK_SIZE < end:
                seq.blocks.append(self.free.pop())
            for pos in range(seq.cached, end):
                input_ids.append(seq.tokens[pos])
                positions.append(pos)
                slots.append(seq.blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            starts.append(starts[-1] + q_len)
            if sample:
                logits_rows.append(starts[-1] - 1)
            seq.cached = end
        width = max(len(s.blocks) for s in seqs)
        tables = [s.blocks + [0] * (width - len(s.blocks)) for s in seqs]
        seq_lens = [s.cached for s in seqs]
        dev = self.loaded.device
        batch = ForwardBatch(
            input_ids=torch.tensor(input_ids, device=dev),
            positions=torch.tensor(positions, device=dev),
            slot_mapping=torch.tensor(slots, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            logits_indices=torch.tensor(logits_rows, dtype=torch.int64, device=dev),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )
        with torch.inference_mode():
            return self.loaded.model(batch, self.kv)


def full_prompt_logits(loaded: LoadedModel, tokens: list[int]) -> torch.Tensor:
    """Every row's logits of one prompt prefilled in one step through shuffled blocks."""
    cache = PagedCache.create(loaded)
    seq = PagedSequence(tokens)
    seq.blocks = [cache.free.pop() for _ in range(-(-len(tokens) // BLOCK_SIZE))]
    slots = [seq.blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(len(tokens))]
    n, dev = len(tokens), loaded.device
    batch = ForwardBatch(
        input_ids=torch.tensor(tokens, device=dev),
        positions=torch.arange(n, device=dev),
        slot_mapping=torch.tensor(slots, device=dev),
        block_tables=torch.tensor([seq.blocks], dtype=torch.int32, device=dev),
        seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
        logits_indices=torch.arange(n, device=dev),
        max_query_len=n,
        max_seq_len=n,
    )
    with torch.inference_mode():
        return loaded.model(batch, cache.kv)


def greedy(loaded: LoadedModel, tokens: list[int], max_new_tokens: int) -> list[int]:
    """Prefill, then decode one token per step through the cache; stop on eos like generate()."""
    cache = PagedCache.create(loaded, seed=1)
    seq = PagedSequence(list(tokens))
    logits = cache.step([seq], [len(tokens)])
    out: list[int] = []
    while True:
        token = int(logits[0].argmax())
        out.append(token)
        if token in loaded.eos_token_ids or len(out) == max_new_tokens:
            return out
        seq.tokens.append(token)
        logits = cache.step([seq], [1])


def hf_greedy(hf: Any, tokens: list[int], max_new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(torch.tensor([tokens], device=hf.device), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(tokens) :].tolist()


@pytest.fixture(scope="module", params=TINY_ARCHS)
def pair(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path]) -> tuple[LoadedModel, PreTrainedModel]:
    path = tiny_model_dirs[request.param]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return load_model(str(path), dtype="float32", device="cpu"), hf


def test_prefill_logits_equal_hf(pair: tuple[LoadedModel, PreTrainedModel]) -> None:
    loaded, hf = pair
    for prompt in PROMPTS:
        tokens = loaded.encode_prompt(prompt)
        ours = full_prompt_logits(loaded, tokens)
        with torch.inference_mode():
            ref = hf(torch.tensor([tokens])).logits[0].float()
        assert ours.shape == ref.shape == (len(tokens), loaded.vocab_size)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_greedy_decode_equals_hf_generate(pair: tuple[LoadedModel, PreTrainedModel]) -> None:
    loaded, hf = pair
    for prompt in PROMPTS:
        tokens = loaded.encode_prompt(prompt)
        expected = hf_greedy(hf, tokens, 24)
        assert len(set(expected)) > 3, "the tiny model should not be stuck on one token"
        assert greedy(loaded, tokens, 24) == expected


def test_ragged_mixed_batch_equals_each_sequence_alone(pair: tuple[LoadedModel, PreTrainedModel]) -> None:
    loaded, _ = pair
    prompts = [loaded.encode_prompt(p) for p in PROMPTS]
    # Alone: each sequence's logits after its full prompt, and after one more (decoded) token.
    alone_last = [full_prompt_logits(loaded, t)[-1] for t in prompts]
    extra = 7
    alone_decode = full_prompt_logits(loaded, [*prompts[2], extra])[-1]

    cache = PagedCache.create(loaded, seed=3)
    chunked = PagedSequence(prompts[0])  # prefilled in two chunks, the second one inside the mixed step
    fresh = PagedSequence(prompts[1])  # whole prompt inside the mixed step
    decoding = PagedSequence(prompts[2])  # prefilled before; one decode row in the mixed step
    nothing = cache.step([chunked], [3], sample=False)  # a step of prefill chunks only samples nothing
    assert nothing.shape == (0, loaded.vocab_size)
    cache.step([decoding], [len(prompts[2])])
    decoding.tokens.append(extra)
    mixed = cache.step([chunked, fresh, decoding], [len(prompts[0]) - 3, len(prompts[1]), 1])
    torch.testing.assert_close(mixed[0], alone_last[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed[1], alone_last[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mixed[2], alone_decode, atol=1e-5, rtol=1e-5)


ROPE_VARIANTS = {
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
}


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_rope_scaling_equals_hf(variant: str, tmp_path: Path) -> None:
    path = build_tiny_model("llama", tmp_path / variant, overrides={"rope_parameters": ROPE_VARIANTS[variant]})
    loaded = load_model(str(path), dtype="float32", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # Long enough that the scaled low frequencies matter (positions well past 64).
    tokens = loaded.encode_prompt(" ".join(PROMPTS) * 4)
    assert len(tokens) > 100
    with torch.inference_mode():
        ref = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(full_prompt_logits(loaded, tokens), ref, atol=1e-5, rtol=1e-5)
    assert greedy(loaded, tokens[:20], 16) == hf_greedy(hf, tokens[:20], 16)


CONFIG_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # head_dim set explicitly and unequal to hidden / heads (as in Mistral-Nemo): 4 x 32 = 128 != 64.
    "mistral-wide-heads": ("mistral", {"head_dim": 32}),
    # Llama with every optional bias (o_proj and the MLP too), and an untied head.
    "llama-biases-untied": ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}),
    # Multi-query attention: one KV head for all four query heads.
    "qwen2-mqa": ("qwen2", {"num_key_value_heads": 1}),
}


@pytest.mark.parametrize("variant", sorted(CONFIG_VARIANTS))
def test_config_variants_equal_hf(variant: str, tmp_path: Path) -> None:
    arch, overrides = CONFIG_VARIANTS[variant]
    path = build_tiny_model(arch, tmp_path / variant, overrides=overrides)
    loaded = load_model(str(path), dtype="float32", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens = loaded.encode_prompt(PROMPTS[2])
    with torch.inference_mode():
        ref = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(full_prompt_logits(loaded, tokens), ref, atol=1e-5, rtol=1e-5)
    assert greedy(loaded, tokens, 12) == hf_greedy(hf, tokens, 12)


def test_mistral_sliding_window_shorter_than_context_is_refused(tmp_path: Path) -> None:
    path = build_tiny_model("mistral", tmp_path / "mistral")
    config = json.loads((path / "config.json").read_text())
    config["sliding_window"] = 8
    (path / "config.json").write_text(json.dumps(config))
    loaded = load_model(str(path), dtype="float32", device="cpu")
    assert loaded.max_position == 8
    tokens = loaded.encode_prompt("Hello, world! How are you today?")
    assert len(tokens) > 8
    with pytest.raises(ValueError, match=r"context of \d+ tokens exceeds this model's limit of 8"):
        full_prompt_logits(loaded, tokens)
    # Within the window, attention is exactly causal: still equal to HF.
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = hf(torch.tensor([tokens[:8]])).logits[0]
    torch.testing.assert_close(full_prompt_logits(loaded, tokens[:8]), ref, atol=1e-5, rtol=1e-5)


def test_weights_are_shared_not_copied(tiny_llama: Path, tiny_mistral: Path) -> None:
    tied = load_model(str(tiny_llama), dtype="float32", device="cpu").model
    untied = load_model(str(tiny_mistral), dtype="float32", device="cpu").model
    assert isinstance(tied, LlamaCausalLM)
    assert isinstance(untied, LlamaCausalLM)
    assert tied.lm_head.data_ptr() == tied.embed.data_ptr()
    untied_head = untied.lm_head.to_dense() if untied.lm_head.is_mkldnn else untied.lm_head  # oneDNN's storage
    assert untied_head.data_ptr() != untied.embed.data_ptr()
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    hf_params = sum(p.numel() for p in hf.parameters())  # HF dedups the tied head too
    ours = sum(p.numel() for p in tied.parameters())
    assert ours == hf_params


def test_bfloat16_runs_close_to_float32(tiny_llama: Path) -> None:
    fp32 = load_model(str(tiny_llama), dtype="float32", device="cpu")
    bf16 = load_model(str(tiny_llama), dtype="bfloat16", device="cpu")
    assert bf16.dtype == torch.bfloat16
    tokens = fp32.encode_prompt(PROMPTS[0])
    ours = full_prompt_logits(bf16, tokens)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, full_prompt_logits(fp32, tokens), atol=0.15, rtol=0.05)


@pytest.mark.slow
def test_smollm2_knows_paris_and_equals_hf_generate(smollm2_dir: Path) -> None:
    loaded = load_model(str(smollm2_dir), dtype="float32", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    paris = greedy(loaded, loaded.encode_prompt("The capital of France is"), 8)
    assert "Paris" in loaded.tokenizer.decode(paris)
    chat = loaded.encode_chat([{"role": "user", "content": "Name three colours."}])
    for tokens in (loaded.encode_prompt("def fibonacci(n):"), chat):
        assert greedy(loaded, tokens, 16) == hf_greedy(hf, tokens, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_cuda_forward_equals_hf(arch: str, tiny_model_dirs: dict[str, Path]) -> None:
    path = tiny_model_dirs[arch]
    loaded = load_model(str(path), dtype="float32", device="cuda")
    assert loaded.model.device.type == "cuda"
    hf: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf = hf.cuda().eval()
    tokens = loaded.encode_prompt(PROMPTS[2])
    with torch.inference_mode():
        ref = hf(torch.tensor([tokens], device="cuda")).logits[0]
    torch.testing.assert_close(full_prompt_logits(loaded, tokens), ref, atol=1e-4, rtol=1e-4)
    assert greedy(loaded, tokens, 24) == hf_greedy(hf, tokens, 24)
