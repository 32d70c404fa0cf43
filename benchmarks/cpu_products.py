"""bfloat16 matrix products on CPU, layout against layout: the kernels' packed product (`cpu_amx_source`: AMX
tiles, or AVX512-BF16 dot products without AMX) and oneDNN's packed product, on SmolLM2-135M's weight shapes,
at the row counts a step multiplies; and float32's product (`prepare`'s choice) beside them.

    .venv/bin/python benchmarks/cpu_products.py [--rows 1,16,32,64,128,512] [--copies 8]

Each product runs over `--copies` distinct weights in turn, so the weights come from memory as in a
decode step (a single weight would stay in cache); the layouts alternate round by round and the
median round is printed, with the bfloat16 weight bytes read per second and the ratios oneDNN time /
packed time and float32 time / packed time. Needs a CPU with AMX or AVX512-BF16 (it says so and exits 0
elsewhere).
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
from mcpmux.inference.models.linear import PACK_ROWS, linear, pack_bf16, prepare

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
    if cpu_fused.enable(wait=True) is None or not cpu_fused.packed_bf16():
        print("no packed product here (the CPU has neither AMX nor AVX512-BF16, or the kernels did not build)")
        return
    cpu_fused.set_pool_quiet(True)  # the pool as the engine runs it on a quiet host
    packed = "AMX" if cpu_fused.amx_tiles() else "dpbf16"
    print(f"torch threads: {torch.get_num_threads()}; the packed layout multiplied by {packed}; {args.copies} "
          f"weights per shape, median of {args.rounds} alternating rounds")  # fmt: skip
    print(f"{'product':<8} {'rows':>5} {packed + ' us':>9} {'GB/s':>6} {'oneDNN us':>10} {'GB/s':>6} "
          f"{'oneDNN/' + packed:>13} {'fp32 us':>9} {'fp32/' + packed:>11}")  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    for name, n, k in SHAPES:
        copies = args.copies if name != "head" else 2
        plain = [torch.randn(n, k, generator=generator) for _ in range(copies)]
        weights = [w.to(torch.bfloat16) for w in plain]
        layouts = {
            "packed": [pack_bf16(w) for w in weights],
            "onednn": [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) for w in weights],
            "fp32": [prepare(w) for w in plain],
        }
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, generator=generator)
            inputs = {layout: x if layout == "fp32" else x.to(torch.bfloat16) for layout in layouts}
            for layout, ws in layouts.items():
                linear(inputs[layout], ws[0])  # warm
            samples: dict[str, list[float]] = {layout: [] for layout in layouts}
            for _ in range(args.rounds):
                for layout, ws in layouts.items():
                    samples[layout].append(seconds(partial(multiply, inputs[layout], ws)) / copies)
            each = {layout: statistics.median(s) for layout, s in samples.items()}
            gbs = {layout: n * k * 2 / each[layout] / 1e9 for layout in ("packed", "onednn")}
            print(f"{name:<8} {rows:>5} {each['packed'] * 1e6:9.1f} {gbs['packed']:6.1f} {each['onednn'] * 1e6:10.1f} "
                  f"{gbs['onednn']:6.1f} {each['onednn'] / each['packed']:13.2f} {each['fp32'] * 1e6:9.1f} "
                  f"{each['fp32'] / each['packed']:11.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
