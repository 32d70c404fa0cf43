"""What batch invariance (`MCPMUX_BATCH_INVARIANT`, `kernels.cpu_fused`) costs: the same requests with it on and
off, in one process, alternating, on the builtin model with its fused kernels.

    .venv/bin/python benchmarks/batch_invariance.py [--dtype bfloat16] [--rounds 3]

Two workloads: 32 chat requests of 32 tokens (short prompts: the kernels' paths are the same either way)
and 8 prompts of about 450 tokens with 8 output tokens each (their second prefill chunk attends 256
queries over up to 512 keys, which SDPA takes without invariance). Prints wall seconds per workload
and the per-round speed ratio (invariant over not); greedy tokens of the two settings are compared.
The setting is read once per process, so this script flips it between rounds through the setting's
cache and the model's one-call decoder, which holds the attention limit it was built with.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.engine.llm_engine import LLMEngine
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models.loader import LoadedModel, load_model

WORDS = "the quick brown fox jumps over a lazy dog while paged attention stores keys and values".split()  # noqa: SIM905


def serve(loaded: LoadedModel, prompts: list[list[int]], out: int) -> tuple[float, list[list[int]]]:
    engine = LLMEngine(EngineConfig(model=loaded.name, device="cpu", enable_prefix_caching=False), loaded)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True))
    tokens: list[list[int]] = [[] for _ in prompts]
    start = time.perf_counter()
    while engine.has_unfinished():
        for delta in engine.step():
            tokens[int(delta.request_id)] += delta.token_ids
    return time.perf_counter() - start, tokens


def invariant(loaded: LoadedModel, on: bool) -> None:
    os.environ[cpu_fused.INVARIANT_ENV_VAR] = "1" if on else "0"
    cpu_fused.batch_invariant.cache_clear()
    loaded.model._decoder = None  # type: ignore[union-attr]  # rebuilt with the new attention limit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    loaded = load_model("builtin:smollm2-135m", args.dtype)
    if cpu_fused.wait() is None:
        raise SystemExit("the fused CPU kernels did not build: nothing to compare")
    rng = random.Random(0)
    chat = [loaded.encode_chat([{"role": "user", "content": f"Tell me about topic {i}."}]) for i in range(32)]
    long = [loaded.encode_prompt(" ".join(rng.choice(WORDS) for _ in range(450))) for _ in range(8)]
    for name, prompts, out in (("32 chat requests x 32 tokens", chat, 32), ("8 prompts of ~450 tokens x 8", long, 8)):
        invariant(loaded, True)
        serve(loaded, prompts[:2], 2)  # warm-up
        seconds: dict[bool, list[float]] = {True: [], False: []}
        answers: dict[bool, list[list[int]]] = {}
        for rnd in range(args.rounds):
            for on in (True, False) if rnd % 2 == 0 else (False, True):
                invariant(loaded, on)
                took, answers[on] = serve(loaded, prompts, out)
                seconds[on].append(took)
        ratios = [off / on for on, off in zip(seconds[True], seconds[False], strict=True)]
        same = sum(a == b for a, b in zip(answers[True], answers[False], strict=True))
        print(f"{args.dtype}, {name}: invariant {statistics.median(seconds[True]):.2f} s, not "
              f"{statistics.median(seconds[False]):.2f} s; speed invariant/not per round "
              f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f}); greedy answers "
              f"equal in {same}/{len(prompts)}; load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
