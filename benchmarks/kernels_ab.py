"""A/B of the fused CPU kernels: this tree's against another tree's, in one process, step by step.

    git worktree add ../base main      # or: mkdir ../base && git archive main | tar -x -C ../base
    .venv/bin/python benchmarks/kernels_ab.py ../base                  # 32 sequences, bf16, one thread
    .venv/bin/python benchmarks/kernels_ab.py ../base --seqs 64 --threads 2
    .venv/bin/python benchmarks/kernels_ab.py ../base --prefill --dtype float32 --prompt-len 39 --threads 2

Both builds run the same engine, model and sequences: each round admits `--seqs` fresh requests, then
alternates the two kernel modules decode step by decode step, timing each step by the calling thread's
CPU clock (one thread) or the wall clock (more). On a shared host a decode step moves by up to 2x from
one process to the next (memory placement, what the other jobs do), more than most kernel changes: in
two processes run one after the other, the same change read 0.85-0.94x with one order and 1.00-1.08x
with the other (docs/perf.md); alternating inside one process, two builds of the same kernels read
0.999x and 1.004x at one thread and 0.985x at two threads by the wall clock. Both pools wait as the
engine's governor set this tree's (`cpu_fused.set_pool_quiet`): with the other pool left as on a busy host
(its threads sleeping after 5 us instead of 50), two builds of the same kernels read 0.867x at 4 float32
sequences and two threads (a short decode step's loops found its worker asleep), 0.989x on prefill steps.

`--prefill` times prefill steps instead: each step admits `--seqs` fresh requests of `--prompt-len` tokens
and runs the engine's first step on them (a full `max_num_batched_tokens` budget of prompts, the shape of
`engine.py`'s offline workload when everything arrives at once: 32 prompts of ~39 tokens fill 512 tokens
with 13 whole prompts and part of a 14th), then aborts them; with `--whole`, every step until the prompts
are prefilled (a long prompt's later chunks attend all the keys before them):

    .venv/bin/python benchmarks/kernels_ab.py ../base --prefill --whole --seqs 1 --prompt-len 4000 \
        --dtype float32 --threads 2 --rounds 2 --steps 4

Only the C++ sources come from the other tree (its `cpu_pool_source`, `cpu_amx_source` and
`cpu_fused_source`); the model, its packed weights and the engine are this tree's, so the two
sources must take the same arguments. Its `Decoder` class is registered module-local (pybind11 keeps
one registry per process, and two builds would both define it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.kernels.jit_build import load as build_and_load

_SOURCES = ("cpu_pool_source", "cpu_amx_source", "cpu_fused_source")  # the order cpu_fused builds them in


def other_sources(tree: Path) -> list[str]:
    """The kernels' C++ sources of `tree`, its Decoder made module-local."""
    sources = []
    for name in _SOURCES:
        path = tree / "mcpmux" / "inference" / "kernels" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"other_{name}", path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"{path}: not a kernel source")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sources.append(module.SOURCE)
    declared = 'py::class_<Decoder>(m, "Decoder")'
    if declared not in sources[-1]:
        raise SystemExit(f"{tree}: its cpu_fused_source declares no Decoder this tool knows how to load beside ours")
    sources[-1] = sources[-1].replace(declared, 'py::class_<Decoder>(m, "Decoder", py::module_local())')
    return sources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", type=Path, help="the other tree (its mcpmux/inference/kernels sources)")
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=30, help="timed decode steps a round, the sides alternating")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefill", action="store_true", help="time first (prefill) steps instead of decode steps")
    ap.add_argument("--whole", action="store_true", help="with --prefill: time every step of the prompts' prefill")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    config = EngineConfig(
        model=args.model, device="cpu", dtype=args.dtype, num_blocks=max(2048, args.seqs * 64),
        max_num_seqs=max(64, args.seqs), max_num_batched_tokens=max(512, args.seqs), cpu_threads=args.threads,
        enable_prefix_caching=not args.prefill,
    )  # fmt: skip
    engine = LLMEngine(config)
    ours = cpu_fused.wait()
    if ours is None:
        raise SystemExit("this tree's fused CPU kernels did not build (see the log above)")
    capability = torch.backends.cpu.get_cpu_capability().lower() + cpu_fused._bf16_suffix()
    theirs = build_and_load(f"mcpmux_cpu_fused_{capability}", other_sources(args.other), cpu_fused._CFLAGS)
    theirs.set_pool(args.threads)
    if hasattr(theirs, "set_pool_quiet"):  # as the engine's governor set ours: both pools wait alike
        theirs.set_pool_quiet(cpu_fused.pool_quiet())
    sides = {"this tree": ours, str(args.other): theirs}
    names = list(sides)
    times: dict[str, list[float]] = {name: [] for name in names}
    rng = random.Random(0)
    vocab = len(engine.loaded.tokenizer)
    params = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
    load_before = os.getloadavg()[0]
    for r in range(args.rounds):
        if args.prefill:
            prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.seqs)]
            for s in range(2 * len(names) + args.steps):  # the first two a side a warm-up
                name = names[(s + r) % len(names)]
                cpu_fused._module = sides[name]
                for i, prompt in enumerate(prompts):
                    engine.add_request(f"r{r}-{s}-{i}", prompt, params)
                start = clock()
                engine.step()
                while args.whole and (engine.scheduler.waiting or any(
                    seq.num_computed_tokens < seq.num_prompt_tokens for seq in engine.scheduler.running
                )):  # fmt: skip
                    engine.step()
                if s >= 2 * len(names):
                    times[name].append(clock() - start)
                engine.abort_all()
            continue
        for i in range(args.seqs):
            engine.add_request(f"r{r}-{i}", [rng.randrange(vocab) for _ in range(args.prompt_len)], params)
        while engine.scheduler.waiting or any(
            seq.num_computed_tokens < seq.num_prompt_tokens for seq in engine.scheduler.running
        ):
            engine.step()  # admission and prefill, not timed
        for s in range(2 * len(names)):  # warm-up: each side's decoder built, caches touched
            cpu_fused._module = sides[names[s % len(names)]]
            engine.step()
        for s in range(args.steps):
            name = names[(s + r) % len(names)]
            cpu_fused._module = sides[name]
            start = clock()
            engine.step()
            times[name].append(clock() - start)
        engine.abort_all()
    cpu_fused._module = ours
    what = "CPU time of one thread" if args.threads == 1 else f"wall clock, {args.threads} threads"
    shape = f"{args.seqs} sequences decoding"
    if args.prefill:
        shape = f"{'whole prefills' if args.whole else 'prefill steps'} of {args.seqs} {args.prompt_len}-token prompts"
    print(f"{args.model}, {args.dtype}, {shape}, {what}, load average "
          f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}")  # fmt: skip
    base = statistics.mean(times[names[1]])
    for name in names:
        t = times[name]
        print(f"  {name:<24} step mean {statistics.mean(t) * 1e3:6.2f} ms, median {statistics.median(t) * 1e3:6.2f} ms "
              f"({len(t)} steps): {statistics.mean(t) / base:.3f}x the other tree's")  # fmt: skip


if __name__ == "__main__":
    main()
