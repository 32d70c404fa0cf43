"""The Triton kernels on a real GPU: checked against the torch reference, then timed.

    .venv/bin/python benchmarks/kernels_gpu.py            # every case (a few minutes on one GPU)
    .venv/bin/python benchmarks/kernels_gpu.py --quick    # fewer cases, shorter timing

Shapes are SmolLM2-135M-like (9 heads, 3 KV heads, head_dim 64) and Llama-8B-like (32 heads, 8 KV
heads, head_dim 128), KV block size 16, bf16 unless stated. Attention workloads mix decode rows and
prefill/extend rows as an engine step does. Each attention case is first compared with the torch
reference (fp32 softmax), then timed with ``triton.testing.do_bench`` (median) against torch SDPA on
K/V gathered from the paged cache into padded dense tensors (the gather is part of its cost), and for
decode-only batches against the Triton kernel with split-KV turned off, which shows where split-KV
pays. KV write, RMSNorm (+residual) and rotary are timed against their torch reference.

Prints a table and writes ``benchmarks/results/kernels_gpu.json``; exits 1 if any check fails.
Without CUDA it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from math import nan
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "kernels_gpu.json"
BLOCK_SIZE = 16
DEVICE = torch.device("cuda")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int


MODELS = [Model("smollm2-135m", 9, 3, 64, 576), Model("llama-8b", 32, 8, 128, 4096)]


@dataclass(slots=True)
class Row:
    kernel: str
    model: str
    case: str
    dtype: str
    max_err: float
    ok: bool
    triton_ms: float
    baseline: str
    baseline_ms: float

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.triton_ms if self.triton_ms > 0 else float("nan")


def workloads(quick: bool) -> dict[str, list[tuple[int, int]]]:
    """(seq_len, q_len) per sequence for each attention case; fixed seed, so runs compare."""
    rng = random.Random(0)
    cases = {
        "decode 64 x 256-2k": [(rng.randint(256, 2048), 1) for _ in range(64)],
        "mixed 32 decode + 2 x 512 prefill": [(rng.randint(512, 2048), 1) for _ in range(32)]
        + [(512, 512), (512, 512)],
        "long decode 4 x 16k (split-KV)": [(16384, 1)] * 4,
    }
    if not quick:
        cases["extend 4 x (2k ctx + 256)"] = [(2304, 256)] * 4
        cases["prefill 4 x 1024"] = [(1024, 1024)] * 4
        cases["decode 256 x 64-1k"] = [(rng.randint(64, 1024), 1) for _ in range(256)]
    return cases


@dataclass(slots=True)
class Step:
    """One paged-attention call's inputs plus what the SDPA baseline needs, precomputed."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    scale: float
    token_seq: torch.Tensor  # [T] which sequence each query token belongs to
    token_row: torch.Tensor  # [T] its row in the padded query tensor
    mask: torch.Tensor  # [S, 1, max_query_len, max_seq_len] causal visibility for the padded layout


def make_step(model: Model, specs: list[tuple[int, int]], dtype: torch.dtype) -> Step:
    dev = DEVICE
    blocks = [-(-s // BLOCK_SIZE) for s, _ in specs]
    num_blocks = sum(blocks)
    shape = (num_blocks, BLOCK_SIZE, model.num_kv_heads, model.head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=dev)
    v_cache = torch.randn(shape, dtype=dtype, device=dev)
    order = torch.randperm(num_blocks, device=dev).to(torch.int32)
    tables = torch.zeros(len(specs), max(blocks), dtype=torch.int32, device=dev)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[used : used + n]
        used += n
    q_lens = [q for _, q in specs]
    max_q, max_l = max(q_lens), max(s for s, _ in specs)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    token_seq = torch.repeat_interleave(torch.arange(len(specs)), torch.tensor(q_lens)).to(dev)
    token_row = torch.cat([torch.arange(n) for n in q_lens]).to(dev)
    mask = torch.zeros(len(specs), 1, max_q, max_l, dtype=torch.bool, device=dev)
    for i, (seq_len, q_len) in enumerate(specs):
        q_pos = torch.arange(seq_len - q_len, seq_len, device=dev)
        mask[i, 0, :q_len, :seq_len] = torch.arange(seq_len, device=dev)[None, :] <= q_pos[:, None]
        mask[i, 0, q_len:, 0] = True  # padding rows see one key, so they stay finite (and are dropped)
    return Step(
        q=torch.randn(starts[-1], model.num_heads, model.head_dim, dtype=dtype, device=dev),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables,
        seq_lens=torch.tensor([s for s, _ in specs], dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        max_query_len=max_q,
        max_seq_len=max_l,
        scale=model.head_dim**-0.5,
        token_seq=token_seq,
        token_row=token_row,
        mask=mask,
    )


def sdpa_gathered(step: Step) -> torch.Tensor:
    """The plain-torch way: gather each sequence's K/V into padded dense tensors, one masked SDPA."""
    num_seqs, num_heads, head_dim = step.seq_lens.shape[0], step.q.shape[1], step.q.shape[2]
    k = step.k_cache[step.block_tables.long()].flatten(1, 2)[:, : step.max_seq_len].transpose(1, 2)
    v = step.v_cache[step.block_tables.long()].flatten(1, 2)[:, : step.max_seq_len].transpose(1, 2)
    q = step.q.new_zeros(num_seqs, step.max_query_len, num_heads, head_dim)
    q[step.token_seq, step.token_row] = step.q
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=step.mask, scale=step.scale, enable_gqa=True
    )
    return o.transpose(1, 2)[step.token_seq, step.token_row]


def bench(fn: Callable[[], object], quick: bool) -> float:
    import triton.testing

    return float(
        triton.testing.do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100, return_mode="median")
    )


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def attention_rows(model: Model, case: str, specs: list[tuple[int, int]], quick: bool) -> list[Row]:
    from mcpmux.inference.kernels import reference
    from mcpmux.inference.kernels.triton_attention import paged_attention

    rows = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        if dtype != torch.bfloat16 and not case.startswith("mixed"):
            continue  # other dtypes are checked on the mixed step only, and not timed
        step = make_step(model, specs, dtype)
        args = (
            step.q,
            step.k_cache,
            step.v_cache,
            step.block_tables,
            step.seq_lens,
            step.query_start_loc,
            step.scale,
            step.max_query_len,
            step.max_seq_len,
        )
        expected = reference.paged_attention(*args[:7])
        bound = TOLERANCE[dtype] * max(1.0, float(expected.abs().max()))
        err = max_err(paged_attention(*args), expected)
        # The baseline must be right too, or its time means nothing.
        ok = err <= bound and max_err(sdpa_gathered(step), expected) <= bound
        dt = str(dtype).removeprefix("torch.")
        if dtype != torch.bfloat16:
            rows.append(Row("paged_attention", model.name, case, dt, err, ok, nan, "(checked only)", nan))
            continue
        t_ms = bench(partial(paged_attention, *args), quick)
        rows.append(
            Row(
                "paged_attention",
                model.name,
                case,
                dt,
                err,
                ok,
                t_ms,
                "sdpa on gathered K/V",
                bench(partial(sdpa_gathered, step), quick),
            )
        )
        if step.max_query_len == 1:
            single = bench(partial(paged_attention, *args, num_splits=1), quick)
            rows.append(Row("paged_attention", model.name, case, dt, err, ok, t_ms, "triton, no split-KV", single))
    return rows


def elementwise_rows(model: Model, quick: bool) -> list[Row]:
    from mcpmux.inference.kernels import reference
    from mcpmux.inference.kernels.triton_kv import write_kv
    from mcpmux.inference.kernels.triton_norm import rms_norm
    from mcpmux.inference.kernels.triton_rotary import rotary_embedding

    dev, dtype, tokens = DEVICE, torch.bfloat16, 4096
    case, dt = f"{tokens} tokens", "bfloat16"
    rows = []

    kv_shape = (tokens // BLOCK_SIZE * 2, BLOCK_SIZE, model.num_kv_heads, model.head_dim)
    key = torch.randn(tokens, model.num_kv_heads, model.head_dim, dtype=dtype, device=dev)
    value = torch.randn_like(key)
    slots = torch.randperm(kv_shape[0] * BLOCK_SIZE, device=dev)[:tokens]
    slots[::7] = -1
    caches = [torch.zeros(kv_shape, dtype=dtype, device=dev) for _ in range(4)]
    write_kv(key, value, caches[0], caches[1], slots)
    reference.write_kv(key, value, caches[2], caches[3], slots)
    err = max(max_err(caches[0], caches[2]), max_err(caches[1], caches[3]))
    rows.append(
        Row(
            "write_kv",
            model.name,
            case,
            dt,
            err,
            err == 0.0,
            bench(lambda: write_kv(key, value, caches[0], caches[1], slots), quick),
            "torch reference",
            bench(lambda: reference.write_kv(key, value, caches[2], caches[3], slots), quick),
        )
    )

    x = torch.randn(tokens, model.hidden, dtype=dtype, device=dev)
    residual = torch.randn_like(x)
    weight = torch.randn(model.hidden, dtype=dtype, device=dev)
    normed, h = rms_norm(x, weight, 1e-5, residual)
    ref_normed, ref_h = reference.rms_norm(x, weight, 1e-5, residual)
    err = max(max_err(normed, ref_normed), max_err(h, ref_h))
    ok = err <= TOLERANCE[dtype] * max(1.0, float(ref_normed.abs().max()))
    rows.append(
        Row(
            "rms_norm + residual",
            model.name,
            case,
            dt,
            err,
            ok,
            bench(lambda: rms_norm(x, weight, 1e-5, residual), quick),
            "torch reference",
            bench(lambda: reference.rms_norm(x, weight, 1e-5, residual), quick),
        )
    )

    half = model.head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, device=dev, dtype=torch.float32) / half))
    freqs = torch.arange(8192, device=dev, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    positions = torch.randint(0, 8192, (tokens,), device=dev)
    q = torch.randn(tokens, model.num_heads, model.head_dim, dtype=dtype, device=dev)
    k = torch.randn(tokens, model.num_kv_heads, model.head_dim, dtype=dtype, device=dev)
    ref_q, ref_k = reference.rotary_embedding(positions, q, k, cache)
    out_q, out_k = rotary_embedding(positions, q.clone(), k.clone(), cache)
    err = max(max_err(out_q, ref_q), max_err(out_k, ref_k))
    rows.append(
        Row(
            "rotary_embedding",
            model.name,
            case,
            dt,
            err,
            err <= TOLERANCE[dtype] * 4,
            bench(lambda: rotary_embedding(positions, q, k, cache), quick),
            "torch reference",
            bench(lambda: reference.rotary_embedding(positions, q, k, cache), quick),
        )
    )
    return rows


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'kernel':<20} {'model':<13} {'case':<34} {'dtype':<9} {'max err':>9} {'ok':<4} "
        f"{'triton ms':>10} {'baseline':<22} {'base ms':>9} {'speedup':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.kernel:<20} {r.model:<13} {r.case:<34} {r.dtype:<9} {r.max_err:>9.2e} "
            f"{'yes' if r.ok else 'NO':<4} {r.triton_ms:>10.4f} {r.baseline:<22} {r.baseline_ms:>9.4f} "
            f"{r.speedup:>7.2f}x"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer cases and shorter timing")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernels_gpu: no CUDA device here, nothing to check or time (run it on a GPU machine).")
        return 0
    torch.manual_seed(0)
    rows: list[Row] = []
    for model in MODELS:
        for case, specs in workloads(opts.quick).items():
            rows += attention_rows(model, case, specs, opts.quick)
        rows += elementwise_rows(model, opts.quick)
    print_table(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "quick": opts.quick,
                "rows": [asdict(r) | {"speedup": r.speedup} for r in rows],
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")
    failed = [r for r in rows if not r.ok]
    for r in failed:
        print(f"CHECK FAILED: {r.kernel} {r.model} {r.case} {r.dtype}: max err {r.max_err:.3e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
