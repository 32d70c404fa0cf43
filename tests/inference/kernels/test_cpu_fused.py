"""The fused CPU kernels, built for real with gcc (about a minute on a fresh machine, then cached), against
the torch reference on fresh random inputs in float32 and bfloat16, the one-call decoder against the
layers it replaces, and the engine's fp32 greedy output with them against HF."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.nn import functional as F

from mcpmux.inference import kernels
from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.engine.sampler import SampleRequest, make_generator, sample
from mcpmux.inference.kernels import cpu_fused, reference
from mcpmux.inference.models.linear import (
    float32_on_onednn,
    is_packed,
    linear,
    prepare,
    unpack,
    vocab_logits,
)
from mcpmux.inference.models.llama import LlamaCausalLM
from mcpmux.inference.models.loader import load_model
from tests.inference.engine_harness import PROMPTS, drive, engine_config, greedy_params, hf_reference

pytestmark = [
    pytest.mark.slow,
    # Like the CUDA tests without a GPU: on a machine with no C++ compiler the torch kernels serve.
    pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="needs a C++ compiler (gcc)"),
]


@pytest.fixture(scope="module")
def fused() -> Iterator[ModuleType]:
    module = cpu_fused.enable(wait=True)
    assert module is not None, "the fused CPU kernels did not build (see the warning logged above)"
    yield module
    cpu_fused.disable()


DTYPES = [torch.float32, torch.bfloat16]


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Rounding of a sum taken in another order: float32's, or one bfloat16 step (8 bits of mantissa)."""
    return {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 8e-3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("width", [64, 576, 577])
def test_rms_norm_with_and_without_residual_matches_reference(
    fused: ModuleType, rows: int, width: int, dtype: torch.dtype
) -> None:
    x, residual = (torch.randn(rows, width) * 3).to(dtype), torch.randn(rows, width).to(dtype)
    weight = torch.randn(width).to(dtype)
    normed, h = kernels.rms_norm(x, weight, 1e-6, residual)
    want_normed, want_h = reference.rms_norm(x, weight, 1e-6, residual)
    assert normed.dtype == h.dtype == dtype
    assert torch.equal(h, want_h)
    torch.testing.assert_close(normed, want_normed, **_tolerance(dtype))
    alone = kernels.rms_norm(x, weight, 1e-6)
    assert isinstance(alone, torch.Tensor)
    torch.testing.assert_close(alone, reference.rms_norm(x, weight, 1e-6), **_tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_rotary_rotates_q_and_k_views_in_place_bit_for_bit(
    fused: ModuleType, rotary_dim: int, dtype: torch.dtype
) -> None:
    heads, kv_heads, head_dim, tokens = 9, 3, 64, 5
    # q and k as the model hands them over: strided views into one fused QKV product.
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
    q = qkv[:, : heads * head_dim].reshape(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(tokens, kv_heads, head_dim)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    positions = torch.tensor([0, 1, 17, 300, 2047])
    cos_sin = torch.randn(2048, rotary_dim)
    want_q, want_k = reference.rotary_embedding(positions, q.clone(), k.clone(), cos_sin)
    got_q, got_k = kernels.rotary_embedding(positions, q, k, cos_sin)
    assert torch.equal(got_q, want_q)
    assert torch.equal(got_k, want_k)
    assert got_q.data_ptr() == qkv.data_ptr(), "q should be rotated where it lies"
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before), "v must be left alone"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1536, 40])  # a multiple of 16 lanes, and not
def test_silu_and_mul_matches_reference(fused: ModuleType, dtype: torch.dtype, width: int) -> None:
    gate_up = (torch.randn(7, 2 * width) * 4).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # far tails of the exponential, and zeros
    got = kernels.silu_and_mul(gate_up)
    assert got.dtype == dtype
    assert got.shape == (7, width)
    # Another exponential than ATen's: an ulp or two in float32, at most one bfloat16 rounding step.
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-5}
    torch.testing.assert_close(got, reference.silu_and_mul(gate_up), **tolerance)


def test_other_dtypes_take_the_torch_kernels(fused: ModuleType) -> None:
    x = torch.randn(4, 64, dtype=torch.float16)
    weight = torch.randn(64, dtype=torch.float16)
    got = kernels.rms_norm(x, weight, 1e-6)
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, reference.rms_norm(x, weight, 1e-6))


def test_argmax_is_torchs_first_largest_index(fused: ModuleType) -> None:
    logits = torch.randn(6, 49152)
    logits[1, 7] = logits[1, 9000] = 100.0  # a tie: the first wins
    logits[2] = float("-inf")  # a row with nothing allowed
    logits[3, 123] = float("nan")  # a NaN counts as the largest, as in torch.argmax
    logits[4, 5] = logits[4, 6] = float("inf")
    got = kernels.argmax(logits)
    assert got.dtype == torch.int64
    assert got.tolist() == torch.argmax(logits, dim=-1).tolist()
    assert got.tolist()[1:5] == [7, 0, 123, 5]
    assert kernels.argmax(logits[:0]).shape == (0,)


@pytest.mark.parametrize("k", [1, 50, 256, 3000])
def test_top_k_keeps_torchs_values_with_equals_in_index_order(fused: ModuleType, k: int) -> None:
    torch.manual_seed(0)
    values = torch.randn(5, 49152) * 3
    values[1] = values[1].round()  # thousands of equal values, many at the k-th place
    values[2, 100:] = float("-inf")  # fewer finite values than k (for the larger k)
    values[3, 17] = float("nan")  # ranks below every number
    values[4] = torch.linspace(0.0, -2.0, 49152)
    top, where = kernels.top_k(values, k)
    assert torch.equal(top[[0, 1, 2, 4]], torch.topk(values[[0, 1, 2, 4]], k, dim=1).values)
    assert torch.equal(values.gather(1, where)[[0, 1, 2, 4]], top[[0, 1, 2, 4]])
    for row in range(5):  # every index once; among equal values, the lower index first
        pairs = list(zip(top[row].tolist(), where[row].tolist(), strict=True))
        assert len(set(where[row].tolist())) == k
        assert all(a[0] > b[0] or (a[0] == b[0] and a[1] < b[1]) for a, b in itertools.pairwise(pairs))
    assert 17 not in where[3].tolist()
    assert torch.equal(top[3], torch.topk(values[3].nan_to_num(nan=-torch.inf), k).values)
    assert where[1].tolist() == sorted(range(49152), key=lambda i: (-values[1, i].item(), i))[:k]


def test_sampled_rows_follow_softmax_over_temperature(fused: ModuleType) -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03, 0.0])
    logits = probs.log()[None].repeat(2, 1)  # the last token: a -inf logit, never drawn
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(2, 6)
    for _ in range(4000):
        picks = kernels.sample_rows(logits, [0, 1], [1.0, 0.5], [gen, gen])
        assert picks is not None
        counts[0, picks[0]] += 1
        counts[1, picks[1]] += 1
    sharpened = probs**2 / (probs**2).sum()  # temperature 0.5
    assert torch.allclose(counts[0] / 4000, probs, atol=0.03)
    assert torch.allclose(counts[1] / 4000, sharpened, atol=0.03)
    assert counts[:, 5].sum() == 0


def test_a_sampled_row_is_the_first_token_past_its_draw(fused: ModuleType) -> None:
    logits = torch.full((1, 49152), float("-inf"))
    logits[0, [10, 20000, 49150]] = 0.0  # three equally likely tokens among -inf
    rows, temps = torch.tensor([0, 0, 0, 0]), torch.tensor([1.0] * 4)
    draws = torch.tensor([0.0, 0.34, 0.67, 1.0 - 1e-12], dtype=torch.float64)
    assert fused.sample_rows(logits, rows, temps, draws).tolist() == [10, 20000, 49150, 49150]


def test_seeded_rows_drawn_by_the_kernels_do_not_depend_on_their_neighbours(fused: ModuleType) -> None:
    torch.manual_seed(2)
    rows = torch.randn(5, 49152) * 3

    def requests(order: list[int]) -> list[SampleRequest]:
        cpu = torch.device("cpu")
        return [SampleRequest(SamplingParams(seed=40 + i, temperature=0.7), make_generator(40 + i, cpu)) for i in order]

    alone = [sample(rows[i : i + 1], requests([i])).token_ids[0] for i in range(5)]
    assert sample(rows, requests(list(range(5)))).token_ids == alone
    assert sample(rows.flip(0), requests([4, 3, 2, 1, 0])).token_ids == alone[::-1]
    assert len(set(alone)) > 1


def test_engine_greedy_output_with_fused_kernels_equals_hf(fused: ModuleType, tiny_model_dirs: dict[str, Path]) -> None:
    path = tiny_model_dirs["llama"]
    ref = hf_reference(path)
    loaded = load_model(str(path), dtype="float32", device="cpu")
    config = engine_config(path, num_blocks=256, prefill_chunk_size=5, max_num_batched_tokens=24, max_num_seqs=8)
    run = drive(loaded, config, greedy_params())
    for i in range(len(PROMPTS)):
        assert run.tokens[f"r{i}"] == ref.outputs[i], f"request r{i} ({PROMPTS[i]!r}) differs from HF"


def _scattered_tables(seq_lens: list[int], block: int, pool: int) -> torch.Tensor:
    """Each sequence's blocks scattered over a pool of `pool` blocks, the table padded with zeros."""
    order = torch.randperm(pool, generator=torch.Generator().manual_seed(1)).tolist()
    tables = torch.zeros(len(seq_lens), -(-max(seq_lens) // block), dtype=torch.int32)
    for i, length in enumerate(seq_lens):
        for b in range(-(-length // block)):
            tables[i, b] = order.pop()
    return tables


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 2)])
def test_decode_attention_reads_the_paged_cache_like_the_reference(
    fused: ModuleType, heads: int, kv_heads: int, dtype: torch.dtype
) -> None:
    block, head_dim = 4, 64
    seq_lens = torch.tensor([1, 4, 5, 13, 40, 300], dtype=torch.int32)
    k_cache, v_cache = (torch.randn(2, 128, block, kv_heads, head_dim) * 2).to(dtype).unbind(0)
    tables = _scattered_tables(seq_lens.tolist(), block, 128)
    q = torch.randn(len(seq_lens), heads, head_dim).to(dtype)
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, seq_lens, starts, head_dim**-0.5)
    want = reference.paged_attention(*args)
    got = kernels.paged_attention(*args, 1, int(seq_lens.max()))
    assert got.dtype == dtype
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else _tolerance(dtype)
    torch.testing.assert_close(got, want, **tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_step_of_decode_and_prefill_rows_attends_each_like_the_reference(
    fused: ModuleType, dtype: torch.dtype
) -> None:
    # Decode rows around a prefill from scratch and extends after cached tokens, short ones (the kernel
    # attends them) and a long one (SDPA does, unless `kernels.direct_pairs` gives the kernel every row): one
    # ragged step.
    heads, kv_heads, head_dim, block = 9, 3, 64, 16
    q_lens, seq_lens = [1, 7, 1, 5, 1, 290], [20, 7, 1, 37, 64, 300]
    assert 290 * 300 > kernels.DIRECT_PAIRS >= 5 * 37
    k_cache, v_cache = torch.randn(2, 64, block, kv_heads, head_dim).to(dtype).unbind(0)
    tables = _scattered_tables(seq_lens, block, 64)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, lens, starts, head_dim**-0.5)
    want = reference.paged_attention(*args)
    out = torch.full_like(q, float("nan"))  # every row must be written
    got = kernels.paged_attention(*args, max(q_lens), max(seq_lens), out=out)
    assert got is out
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else _tolerance(dtype)
    torch.testing.assert_close(got, want, **tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("head_dim", "heads", "kv_heads"), [(32, 6, 2), (64, 9, 3), (64, 8, 2), (64, 4, 4), (64, 7, 1)]
)
def test_a_prefills_rows_attend_bit_for_bit_as_each_does_alone(
    fused: ModuleType, head_dim: int, heads: int, kv_heads: int, dtype: torch.dtype
) -> None:
    # A prefill's rows are attended a few at a time, sharing each key and value row they load; every row must
    # come out as it does alone as a decode row at its position (batch invariance), whatever rows share its group.
    block, cached = 8, 5  # an extend after 5 cached tokens: its rows sit at positions 5 ..
    total = 64
    k_cache, v_cache = torch.randn(2, 16, block, kv_heads, head_dim).to(dtype).unbind(0)
    tables = _scattered_tables([total], block, 16)
    scale = head_dim**-0.5
    for q_len in (2, 3, 4, 5, 7, 9, total - cached):
        seq_len = cached + q_len
        q = torch.randn(q_len, heads, head_dim).to(dtype)
        together = torch.empty_like(q)
        lens, starts = torch.tensor([seq_len], dtype=torch.int32), torch.tensor([0, q_len], dtype=torch.int32)
        fused.paged_attention_(q, k_cache, v_cache, tables, lens, starts, scale, 2**62, together)
        for i in range(q_len):
            alone = torch.empty_like(q[i : i + 1])
            at = torch.tensor([seq_len - q_len + i + 1], dtype=torch.int32)
            one = torch.tensor([0, 1], dtype=torch.int32)
            fused.paged_attention_(q[i : i + 1].clone(), k_cache, v_cache, tables, at, one, scale, 2**62, alone)
            assert torch.equal(together[i], alone[0]), f"row {i} of {q_len} differs from the row alone"


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_scatters_rows_and_skips_negative_slots(fused: ModuleType, dtype: torch.dtype) -> None:
    kv = torch.randn(4, 2 * 3 * 64).to(dtype)
    key, value = kv[:, : 3 * 64].reshape(4, 3, 64), kv[:, 3 * 64 :].reshape(4, 3, 64)
    slots = torch.tensor([5, -1, 0, 31])
    caches = [torch.zeros(4, 8, 3, 64, dtype=dtype) for _ in range(4)]
    reference.write_kv(key, value, caches[0], caches[1], slots)
    kernels.write_kv(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[2], caches[0])
    assert torch.equal(caches[3], caches[1])
    assert int((caches[2].flatten(0, 1).abs().sum((1, 2)) > 0).sum()) == 3


def test_the_kernels_share_torchs_openmp_runtime(fused: ModuleType) -> None:
    # Their parallel loops run on torch's own OpenMP threads: a second runtime would start threads
    # that torch.set_num_threads does not reach.
    kernels.rms_norm(torch.randn(256, 576), torch.ones(576), 1e-6)
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc (Linux)")
    runtimes = {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) <= 1, runtimes


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 13, 64, 65, 300])
def test_float32_products_match_f_linear_with_and_without_bias(fused: ModuleType, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    for n, k in ((96, 64), (8, 1536), (52, 72)):  # the last one no multiple of 16: ATen multiplies it
        weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
        x = torch.randn(rows, k, generator=gen)
        for b in (None, bias):
            got = linear(x, weight, b)
            assert got.is_contiguous()
            # Sums of k products of unit normals, in another order (the dot kernel's, or oneDNN's where it takes
            # the rows): rounding grows with their size.
            torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=4e-6 * k**0.5)


@pytest.mark.parametrize(("torch_threads", "pool_threads"), [(1, 2), (1, 3), (2, 2), (1, 0)])
def test_float32_prefill_products_split_over_the_pool_match_f_linear(
    fused: ModuleType, torch_threads: int, pool_threads: int
) -> None:
    # A full prefill step's product, and one where the governor has left torch's team smaller than the pool,
    # run on the pool in blocks of output columns (OpenMP: ATen's); x may be a row slice, as q/k/v splits are.
    gen = torch.Generator().manual_seed(pool_threads)
    weight, bias = torch.randn(1000, 576, generator=gen), torch.randn(1000, generator=gen)
    wide = torch.randn(600, 700, generator=gen)
    x = wide[:, 100:676]
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    cpu_fused.set_pool_threads(pool_threads)
    fused.set_onednn_rows(False)  # MKL's rows, as on CPUs where oneDNN is not much the faster (below)
    try:
        for b in (None, bias):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                got = linear(x, weight, b)
            torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=2e-6 * 576**0.5)
            # The pool took the product exactly where it has threads (with none, MKL's team does).
            assert ("mcpmux::pool_gemm" in {event.name for event in prof.events()}) == (pool_threads > 0)
    finally:
        fused.set_onednn_rows(cpu_fused._onednn_beats_mkl())
        cpu_fused.set_pool_threads(-1)
        torch.set_num_threads(threads)


def test_float32_weights_take_the_faster_of_the_dot_product_and_onednn(fused: ModuleType) -> None:
    # `prepare` times the kernels' dot product against oneDNN's packed weight once (oneDNN 1.5x on an AMD Zen 5,
    # the dot product 1.2-1.5x on an AMX Xeon); either way a product matches F.linear to rounding.
    gen = torch.Generator().manual_seed(13)
    weight, bias = torch.randn(96, 576, generator=gen), torch.randn(96, generator=gen)
    prepared = prepare(weight)
    assert prepared.is_mkldnn == float32_on_onednn()
    for rows in (1, 32, 300):
        x = torch.randn(rows, 576, generator=gen)
        torch.testing.assert_close(linear(x, prepared, bias), F.linear(x, weight, bias), rtol=1e-5, atol=4e-6 * 24)


def test_float32_prefill_products_run_on_onednn_where_it_is_chosen(fused: ModuleType) -> None:
    # Where MKL takes its AVX2 path on an AVX-512 CPU (AMD's), oneDNN multiplies a prefill's rows on the same plain
    # weight; decode rows stay on the dot kernel.
    gen = torch.Generator().manual_seed(11)
    weight, bias = torch.randn(960, 576, generator=gen), torch.randn(960, generator=gen)
    fused.set_onednn_rows(True)
    try:
        for rows in (8, 300):
            x = torch.randn(rows, 576, generator=gen)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                got = linear(x, weight, bias)
            torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=4e-6 * 576**0.5)
            names = {event.name for event in prof.events()}
            assert ("mkldnn::_linear_pointwise" in names) == (rows > 64), names
    finally:
        fused.set_onednn_rows(cpu_fused._onednn_beats_mkl())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_call_layers_give_the_layers_logits_bit_for_bit(
    fused: ModuleType, tiny_model_dirs: dict[str, Path], arch: str, dtype: str
) -> None:
    # Decode steps and short prefills run every layer in one C++ call; layer by layer, the same kernels
    # give the same floats.
    path = tiny_model_dirs[arch]
    loaded = load_model(str(path), dtype=dtype, device="cpu")
    model = loaded.model
    assert isinstance(model, LlamaCausalLM)
    outputs = []
    for one_call in (True, False):
        model.one_call = one_call
        engine = LLMEngine(engine_config(path, dtype=dtype, num_blocks=64, max_num_seqs=4), loaded)
        outputs.append(_greedy_outputs(engine))
    model.one_call = True
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_products_on_the_packed_layout_match_f_linear_whatever_the_rows_beside(
    fused: ModuleType, dtype: torch.dtype
) -> None:
    if dtype == torch.bfloat16 and not cpu_fused.packed_bf16():
        pytest.skip("this CPU has neither AMX nor AVX512-BF16: oneDNN multiplies bfloat16")
    if dtype == torch.float32 and not cpu_fused.packed_f32():
        pytest.skip("this CPU has no AVX-512: float32 weights stay plain")
    # -march=native targets the tiles, the AVX512-BF16 dot products or the AVX-512 FMAs on such a CPU
    if dtype == torch.float32:
        assert fused.packed_f32_built()
    else:
        assert fused.amx_built() if cpu_fused.amx_tiles() else fused.packed_built()
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(160, 96, generator=gen).to(dtype)
    bias = torch.randn(160, generator=gen).to(dtype)
    prepared = prepare(weight)
    assert is_packed(prepared)
    assert torch.equal(unpack(prepared), weight)
    assert not is_packed(prepare(weight[:100]))  # sides must be multiples of 32: not packed then
    for rows in (0, 1, 15, 16, 17, 33, 130):
        wide = torch.randn(rows, 128, generator=gen).to(dtype)
        for x in (wide[:, 16:112], wide[:, 16:112].contiguous().t().contiguous().t()):  # strided rows, transposed
            for b in (None, bias):
                want = F.linear(x.double(), weight.double(), None if b is None else b.double()).to(dtype)
                got = linear(x, prepared, b)
                assert got.is_contiguous()
                # float32: one sum of 96 products in K's order (F.linear's MKL or oneDNN sums in blocks)
                close = {"rtol": 1e-5, "atol": 5e-5} if dtype == torch.float32 else _tolerance(dtype)
                torch.testing.assert_close(got, want, **close)  # shape and dtype too
                # Batch invariance: each row multiplied alone comes out the same, bit for bit.
                alone = [linear(x[i : i + 1], prepared, b) for i in range(rows)]
                assert torch.equal(torch.cat(alone) if alone else got, got)
    # Before the kernels are built, the unpacked weight multiplies: F.linear's result exactly.
    x = torch.randn(5, 96, generator=gen).to(dtype)
    cpu_fused.disable()
    try:
        assert torch.equal(linear(x, prepared, bias), F.linear(x, weight, bias))
    finally:
        cpu_fused.enable()


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_is_silu_and_mul_of_the_gate_up_product_bit_for_bit(fused: ModuleType, dtype: torch.dtype) -> None:
    # The one-call decoder multiplies gate-up and applies SiLU * up in one pass on the packed layout (the product's
    # output never written out); the layers, and prefills, call the product and the activation apart: every
    # row must come out the same either way, or a prompt's greedy answer would depend on its path.
    gen = torch.Generator().manual_seed(5)
    gate_up = torch.randn(192, 96, generator=gen).to(dtype)  # [gate | up], 96 columns each
    bias = torch.randn(192, generator=gen).to(dtype)
    prepared = prepare(gate_up)
    assert is_packed(prepared) == (cpu_fused.packed_bf16() if dtype == torch.bfloat16 else cpu_fused.packed_f32())
    for rows in (0, 1, 15, 16, 17, 33, 70):
        wide = torch.randn(rows, 128, generator=gen).to(dtype)
        for x in (wide[:, 16:112], wide[:, 16:112].contiguous()):
            for b in (None, bias):
                want = kernels.silu_and_mul(linear(x, prepared, b))
                got = fused.swiglu(x, prepared, b, 64)
                assert got.shape == (rows, 96)
                assert torch.equal(got, want)
                # Sums of 96 products in another order, then another exponential; one bfloat16 step.
                close = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else _tolerance(dtype)
                torch.testing.assert_close(got, reference.silu_and_mul(F.linear(x, gate_up, b)), **close)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_logits_are_the_products_values_widened(fused: ModuleType, dtype: torch.dtype) -> None:
    # On the packed layout the output head widens its logits to float32 as it rounds them: the values the sampler sees
    # must be the bfloat16 product's exactly, as before, or greedy answers would move.
    gen = torch.Generator().manual_seed(7)
    head = prepare(torch.randn(256, 96, generator=gen).to(dtype))
    for rows in (1, 17, 33):
        x = torch.randn(rows, 96, generator=gen).to(dtype)
        got = vocab_logits(x, head)
        assert got.dtype == torch.float32
        assert torch.equal(got, linear(x, head).float())


def _greedy_outputs(engine: LLMEngine) -> list[tuple[str, list[int], list[object]]]:
    """Four prompts, greedy, 6 tokens each with their top-3 logprobs: every output, in order."""
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=6, temperature=0.0, logprobs=3))
    seen: list[tuple[str, list[int], list[object]]] = []
    while engine.has_unfinished():
        seen += [(out.request_id, out.token_ids, out.logprobs) for out in engine.step()]
    return seen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernels_pool_gives_openmps_tokens_and_logprobs_bit_for_bit(
    fused: ModuleType, tiny_model_dirs: dict[str, Path], dtype: str
) -> None:
    # Their loops are cut into more chunks on the pool than over an OpenMP team; each row is its own.
    path = tiny_model_dirs["llama"]
    loaded = load_model(str(path), dtype=dtype, device="cpu")
    outputs = []
    for pool_threads in (0, 2, 3):
        engine = LLMEngine(engine_config(path, dtype=dtype, num_blocks=64, max_num_seqs=4), loaded)
        cpu_fused.set_pool_threads(pool_threads)  # after the engine's own choice
        outputs.append(_greedy_outputs(engine))
    cpu_fused.set_pool_threads(-1)
    assert outputs[0] == outputs[1] == outputs[2]


def test_float32_steps_on_the_packed_layout_run_on_the_pool_with_torchs_team_of_one_at_any_length(
    fused: ModuleType, tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # With AVX-512 every float32 product and attention at any length run on the kernels' pool, so every step leaves
    # torch's own team (whose threads spin after each operator on the cores the pool needs) one thread.
    if not cpu_fused.packed_f32():
        pytest.skip("this CPU has no AVX-512: float32 weights stay plain")
    path = tiny_model_dirs["llama"]
    loaded = load_model(str(path), dtype="float32", device="cpu")
    assert is_packed(loaded.model.layers[0].qkv_weight)  # type: ignore[attr-defined]
    engine = LLMEngine(engine_config(path, num_blocks=128, max_num_seqs=4, cpu_threads=2), loaded)
    teams: dict[tuple[int, int], int] = {}  # (query rows, longest context) of each step: torch's team
    forward = loaded.model.forward  # type: ignore[attr-defined]

    def recording(batch: object, kv_caches: object) -> torch.Tensor:
        teams[batch.max_query_len, batch.max_seq_len] = torch.get_num_threads()  # type: ignore[attr-defined]
        return forward(batch, kv_caches)  # type: ignore[no-any-return]

    monkeypatch.setattr(loaded.model, "forward", recording)
    # 520 tokens in chunks of 256: the second, 256 rows over 512 keys, is past DIRECT_PAIRS (SDPA's elsewhere).
    for request_id, prompt in (("short", "Hello there"), ("long", [10 + i % 300 for i in range(520)])):
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    assert 256 * 256 <= kernels.DIRECT_PAIRS < 256 * 512 <= kernels.direct_pairs(torch.float32)
    assert (256, 256) in teams  # the first chunk
    assert (256, 512) in teams  # the second
    assert any(rows == 1 for rows, _ in teams)  # decode steps
    assert set(teams.values()) == {1}
