"""Matrix products on CPU, layout against layout: the kernels' packed product (`cpu_amx_source`: bfloat16 on AMX
tiles or AVX512-BF16 dot products, float32 on AVX-512 FMAs) against oneDNN's packed product in the same dtype,
on SmolLM2-135M's weight shapes, at the row counts a step multiplies.

    .venv/bin/python benchmarks/cpu_products.py [--rows 1,8,32,64,128,512] [--weights-mb 256] [--dtypes D,D]

Each product runs over enough distinct weights in turn to read `--weights-mb` of them (several times a
server CPU's last-level cache), so the weights come from memory as in a decode step; a few weights would
stay in cache and time a product no step runs. Layouts alternate round by round, each run once unmeasured
before its measured run (oneDNN's OpenMP threads spin for a while after a product, and would otherwise
slow whatever runs next on the same cores); the median round is printed, with the weight bytes read per
second and the ratio oneDNN time / packed time. Needs the packed product for the dtype (it says so and
skips the dtype elsewhere).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models.linear import PACK_ROWS, linear, pack

# (name, output features, input features): the fused QKV, o, gate-up, down and the output head.
SHAPES = [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("head", 49152, 576)]


def multiply_seconds(x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """Seconds per product over `weights`, after one unmeasured pass."""
    for weight in weights:
        linear(x, weight)
    start = time.perf_counter()
    for weight in weights:
        linear(x, weight)
    return (time.perf_counter() - start) / len(weights)


def packed_here(dtype: torch.dtype) -> bool:
    return cpu_fused.packed_bf16() if dtype == torch.bfloat16 else cpu_fused.packed_f32()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,32,64,128,512")
    ap.add_argument("--weights-mb", type=int, default=256, help="weight bytes per shape and layout, read in turn")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    if cpu_fused.enable(wait=True) is None:
        print("the fused CPU kernels did not build here: no packed product to time")
        return
    cpu_fused.set_pool_quiet(True)  # the pool as the engine runs it on a quiet host
    bf16 = "AMX" if cpu_fused.amx_tiles() else "dpbf16"
    print(f"torch threads: {torch.get_num_threads()}; {args.weights_mb} MB of weights per shape and layout, "
          f"median of {args.rounds} alternating rounds")  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
        if not packed_here(dtype):
            print(f"{dtype}: no packed product on this CPU")
            continue
        how = bf16 if dtype == torch.bfloat16 else "FMA"
        print(f"\n{str(dtype).removeprefix('torch.')}: the packed layout multiplied by {how}")
        print(f"{'product':<8} {'rows':>5} {'packed us':>10} {'GB/s':>6} {'oneDNN us':>10} {'GB/s':>6} "
              f"{'oneDNN/packed':>14}")  # fmt: skip
        for name, n, k in SHAPES:
            size = n * k * dtype.itemsize
            copies = max(2, math.ceil(args.weights_mb * 2**20 / size))
            plain = [torch.randn(n, k, generator=generator).to(dtype) for _ in range(copies)]
            layouts = {
                "packed": [pack(w) for w in plain],
                "onednn": [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) for w in plain],
            }
            del plain
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k, generator=generator).to(dtype)
                samples: dict[str, list[float]] = {layout: [] for layout in layouts}
                for _ in range(args.rounds):
                    for layout, weights in layouts.items():
                        samples[layout].append(multiply_seconds(x, weights))
                each = {layout: statistics.median(s) for layout, s in samples.items()}
                gbs = {layout: size / each[layout] / 1e9 for layout in layouts}
                print(f"{name:<8} {rows:>5} {each['packed'] * 1e6:10.1f} {gbs['packed']:6.1f} "
                      f"{each['onednn'] * 1e6:10.1f} {gbs['onednn']:6.1f} "
                      f"{each['onednn'] / each['packed']:14.2f}")  # fmt: skip
            del layouts


if __name__ == "__main__":
    main()
