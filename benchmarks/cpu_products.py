"""bfloat16 matrix products on CPU, layout against layout: the AMX tiles' own product (`cpu_amx_source`)
and oneDNN's packed product, on SmolLM2-135M's weight shapes, at the row counts a step multiplies.

    .venv/bin/python benchmarks/cpu_products.py [--rows 1,16,32,64,128,512] [--copies 8]

Each product runs over `--copies` distinct weights in turn, so the weights come from memory as in a
decode step (a single weight would stay in cache); the layouts alternate round by round and the
median round is printed, with the weight bytes read per second and the ratio oneDNN time / AMX time.
Needs a CPU with AMX (it says so and exits 0 elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models.linear import PACK_ROWS, amx_pack, linear

# (name, output features, input features): the fused QKV, o, gate-up, down and the output head.
SHAPES = [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("head", 49152, 576)]


def multiply(x: torch.Tensor, weights: list[torch.Tensor]) -> None:
    for weight in weights:
        linear(x, weight)


def seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,16,32,64,128,512")
    ap.add_argument("--copies", type=int, default=8, help="distinct weights per shape, used in turn")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    if cpu_fused.enable(wait=True) is None or not cpu_fused.amx_tiles():
        print("no AMX product here (the CPU lacks AMX tiles, or the fused kernels did not build): nothing to compare")
        return
    print(f"torch threads: {torch.get_num_threads()}; bfloat16; {args.copies} weights per shape, median of "
          f"{args.rounds} alternating rounds")  # fmt: skip
    print(f"{'product':<8} {'rows':>5} {'AMX us':>9} {'GB/s':>6} {'oneDNN us':>10} {'GB/s':>6} {'oneDNN/AMX':>10}")
    generator = torch.Generator().manual_seed(0)
    for name, n, k in SHAPES:
        copies = args.copies if name != "head" else 2
        weights = [torch.randn(n, k, generator=generator).to(torch.bfloat16) for _ in range(copies)]
        layouts = {
            "amx": [amx_pack(w) for w in weights],
            "onednn": [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) for w in weights],
        }
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, generator=generator).to(torch.bfloat16)
            for packed in layouts.values():
                linear(x, packed[0])  # warm
            samples: dict[str, list[float]] = {layout: [] for layout in layouts}
            for _ in range(args.rounds):
                for layout, packed in layouts.items():
                    samples[layout].append(seconds(partial(multiply, x, packed)) / copies)
            each = {layout: statistics.median(s) for layout, s in samples.items()}
            gbs = {layout: n * k * 2 / s / 1e9 for layout, s in each.items()}
            print(f"{name:<8} {rows:>5} {each['amx'] * 1e6:9.1f} {gbs['amx']:6.1f} {each['onednn'] * 1e6:10.1f} "
                  f"{gbs['onednn']:6.1f} {each['onednn'] / each['amx']:10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
