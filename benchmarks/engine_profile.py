"""Where one engine step's time goes, on CPU or CUDA: scheduling, batch preparation, the forward,
sampling, detokenization and bookkeeping, then the busiest torch operators of a few decode steps.

    .venv/bin/python benchmarks/engine_profile.py --model builtin:smollm2-135m          # CPU
    python3 benchmarks/engine_profile.py --model /tmp/smollm2-random --device cuda        # a GPU

`--seqs` requests with `--prompt-len`-token prompts are admitted and prefilled first; the figures
are then taken over `--steps` decode-only steps of all of them (each step one token per sequence).
Inside the forward each kernel call is timed too (the layer matmuls, the output head, attention, the
KV write, RMSNorm, rotary, SwiGLU); what is left of the forward is Python and dispatch: the
embedding, reshapes and splits, and calling it all, layer by layer. On CPU, where the fused kernels
run every layer of a decode step in one C++ call, those parts come from the same steps run again
layer by layer (the same kernels, each timed; the two step times differ by the Python between them).
The operator table counts the torch operators one step dispatches, and lists the fused kernels
(`mcpmux::...`) among them. On CPU the step is also set against the time it takes to read every
weight once from memory (the bytes of the model's weights at the read rate of a 1 GiB tensor summed
on the same threads, best of 5): a decode step of a few dozen sequences can be no faster than that.

`--clock cpu` runs torch on one thread and times with that thread's CPU clock instead of the wall
clock: the work itself, unchanged by what else the host runs (a shared host stretches wall times
unevenly, most of all where two threads wait for each other at every operator).
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

from mcpmux.inference import kernels as kernel_api
from mcpmux.inference.engine import model_runner
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.detokenizer import IncrementalDetokenizer
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models import llama

CLOCK: list[Callable[[], float]] = [time.perf_counter]


def timed(parts: dict[str, float], name: str, fn: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """`fn`, adding its wall time (device work included) to `parts[name]` on every call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = CLOCK[0]()
        result = fn(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        parts[name] += CLOCK[0]() - start
        return result

    return wrapper


def read_rate(threads: int) -> float:
    """Bytes per second `threads` threads read from memory: a 1 GiB tensor summed, best of 5."""
    data = torch.ones(2**28, dtype=torch.float32)
    best = float("inf")
    team = torch.get_num_threads()
    torch.set_num_threads(threads)
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(team)
    return data.numel() * data.element_size() / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True, help="on CUDA")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"], help="cpu: one thread, its CPU time")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: from the free cores)")
    args = ap.parse_args()
    if args.clock == "cpu":
        torch.set_num_threads(1)
        CLOCK[0] = time.thread_time
    config = EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, num_blocks=max(args.seqs * 16, 1024),
        max_num_seqs=args.seqs, max_num_batched_tokens=max(512, args.seqs), cuda_graphs=args.cuda_graphs,
        cpu_threads=1 if args.clock == "cpu" else args.threads,
    )  # fmt: skip
    engine = LLMEngine(config)
    device = engine.loaded.device
    print(f"fused CPU kernels: {'on' if cpu_fused.wait() is not None else 'off'}")
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
    model_runner.sample = timed(parts, "sample", model_runner.sample, device)
    detokenize = IncrementalDetokenizer.add
    IncrementalDetokenizer.add = timed(parts, "detokenize", detokenize, device)  # type: ignore[method-assign]
    start = CLOCK[0]()
    for _ in range(args.steps):
        engine.step()
    total = CLOCK[0]() - start
    named = sum(parts.values())
    graphs = "" if device.type != "cuda" else f", CUDA graphs {'on' if engine.runner.graphs else 'off'}"
    clock = "wall clock" if args.clock == "wall" else "CPU time of one thread"
    print(f"{args.model} on {device}, {args.dtype}{graphs}: {args.seqs} sequences decoding, {args.steps} steps, "
          f"{clock}")  # fmt: skip
    print(f"step: {total / args.steps * 1e3:.2f} ms ({args.seqs / (total / args.steps):.0f} tokens/s)")
    if device.type == "cpu" and args.clock == "wall":
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # On the step's most threads: the fused kernels' pool has them whatever torch's team for a decode step.
        threads = engine.runner.governor.most if engine.runner.governor is not None else torch.get_num_threads()
        rate = read_rate(threads)
        bound = weight_bytes / rate
        print(
            f"weights read once: {weight_bytes / 1e6:.0f} MB at {rate / 1e9:.1f} GB/s ({threads} "
            f"threads) = {bound * 1e3:.1f} ms; the step is {total / args.steps / bound:.2f}x that bound"
        )
    for name, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<14} {seconds / args.steps * 1e3:8.2f} ms  {seconds / total * 100:5.1f}%")
    print(f"  {'the rest':<14} {(total - named) / args.steps * 1e3:8.2f} ms  {(total - named) / total * 100:5.1f}%")

    # The parts of the forward, timed kernel call by kernel call: on CPU, where the fused kernels run
    # every layer of a decode step in one call, the same steps again layer by layer (the same kernels).
    one_call = getattr(model, "one_call", False)
    if one_call:
        model.one_call = False
    forward = parts["forward"]
    inner: dict[str, float] = defaultdict(float)
    llama.linear = timed(inner, "layer matmuls", llama.linear, device)
    llama.vocab_logits = timed(inner, "output head", llama.vocab_logits, device)
    for name, label in (("paged_attention", "attention"), ("write_kv", "KV write"), ("rms_norm", "RMSNorm"),
                        ("rotary_embedding", "rotary"), ("silu_and_mul", "SwiGLU")):  # fmt: skip
        setattr(kernel_api, name, timed(inner, label, getattr(kernel_api, name), device))
    start = CLOCK[0]()
    for _ in range(args.steps):
        engine.step()
    total = CLOCK[0]() - start
    if one_call:
        print(f"layer by layer (one call per kernel): step {total / args.steps * 1e3:.2f} ms")
        model.one_call = True
    print("inside the forward:")
    inner["Python, dispatch"] = parts["forward"] - forward - sum(inner.values())
    for name, seconds in sorted(inner.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<16} {seconds / args.steps * 1e3:8.2f} ms  {seconds / total * 100:5.1f}% of the step")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            engine.step()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=18))
    ops = sum(e.count for e in prof.key_averages() if e.key.startswith(("aten::", "mkldnn::", "mcpmux::")))
    print(f"operators per step: {ops / 3:.0f} ({ops / 3 / engine.loaded.num_layers:.0f} per layer)")
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"device kernels per step: {len(kernels) / 3:.0f}")


if __name__ == "__main__":
    main()
