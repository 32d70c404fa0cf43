"""Where one engine step's time goes, on CPU or CUDA: scheduling, batch preparation, the forward,
sampling and bookkeeping, then the busiest torch operators of a few decode steps.

    .venv/bin/python benchmarks/engine_profile.py --model builtin:smollm2-135m          # CPU
    python3 benchmarks/engine_profile.py --model /tmp/smollm2-random --device cuda        # a GPU

`--seqs` requests with `--prompt-len`-token prompts are admitted and prefilled first; the figures
are then taken over `--steps` decode-only steps of all of them (each step one token per sequence).
On CUDA each timed part ends with a device synchronisation, so host time and device time are not
confused: `forward` is launch overhead plus kernel time, and the operator table's CUDA column says
how much of it the GPU was busy.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpmux.inference.engine import model_runner
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine


def timed(parts: dict[str, float], name: str, fn: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """`fn`, adding its wall time (device work included) to `parts[name]` on every call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        parts[name] += time.perf_counter() - start
        return result

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True, help="on CUDA")
    args = ap.parse_args()
    config = EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, num_blocks=max(args.seqs * 16, 1024),
        max_num_seqs=args.seqs, max_num_batched_tokens=max(512, args.seqs), cuda_graphs=args.cuda_graphs,
    )  # fmt: skip
    engine = LLMEngine(config)
    device = engine.loaded.device
    rng = random.Random(0)
    vocab = len(engine.loaded.tokenizer)
    params = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)
    for i in range(args.seqs):
        engine.add_request(f"r{i}", [rng.randrange(vocab) for _ in range(args.prompt_len)], params)
    while any(seq.num_computed_tokens < seq.num_prompt_tokens for seq in engine.scheduler.running) or (
        engine.scheduler.waiting
    ):
        engine.step()  # admission and prefill, not timed
    for _ in range(3):
        engine.step()  # warm-up: first launches compile Triton kernels on CUDA

    parts: dict[str, float] = defaultdict(float)
    scheduler, runner, model = engine.scheduler, engine.runner, engine.loaded.model
    scheduler.schedule = timed(parts, "schedule", scheduler.schedule, device)  # type: ignore[method-assign]
    scheduler.postprocess = timed(parts, "postprocess", scheduler.postprocess, device)  # type: ignore[method-assign]
    runner.prepare = timed(parts, "prepare batch", runner.prepare, device)  # type: ignore[method-assign]
    engine.loaded.model = timed(parts, "forward", model, device)  # type: ignore[assignment]
    if runner.graphs is not None:
        runner.graphs.forward = timed(parts, "forward", runner.graphs.forward, device)  # type: ignore[method-assign]
    model_runner.sample = timed(parts, "sample", model_runner.sample, device)  # type: ignore[assignment]
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    total = time.perf_counter() - start
    named = sum(parts.values())
    graphs = "" if device.type != "cuda" else f", CUDA graphs {'on' if engine.runner.graphs else 'off'}"
    print(f"{args.model} on {device}, {args.dtype}{graphs}: {args.seqs} sequences decoding, {args.steps} steps")
    print(f"step: {total / args.steps * 1e3:.2f} ms ({args.seqs / (total / args.steps):.0f} tokens/s)")
    for name, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<14} {seconds / args.steps * 1e3:8.2f} ms  {seconds / total * 100:5.1f}%")
    print(f"  {'the rest':<14} {(total - named) / args.steps * 1e3:8.2f} ms  {(total - named) / total * 100:5.1f}%")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            engine.step()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=18))
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"device kernels per step: {len(kernels) / 3:.0f}")


if __name__ == "__main__":
    main()
