"""What a grammar adds to a decode step: the time of one engine step with every row decoding, plain
against held to a grammar (the tool call of `structured.py`, jump-forward off so both run the same
one-token-per-row steps), at 1, 16 and 64 sequences.

End-to-end TPOT (`structured.py`) mixes the other requests' prefills into every request's time;
this times steps once every request is past its prompt, so the difference is the masks' cost that
the forward pass did not hide. The two kinds alternate, `--rounds` times, in one process.

    python benchmarks/structured_step.py [--levels 1,16,64] [--steps 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.structured import TOOLS, conversations  # noqa: E402
from mcpmux.inference.engine.config import EngineConfig, SamplingParams  # noqa: E402
from mcpmux.inference.engine.llm_engine import LLMEngine  # noqa: E402
from mcpmux.inference.models.loader import load_model  # noqa: E402
from mcpmux.inference.serving.tool_calls import ToolUse  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "structured_step.json"


def step_ms(engine: LLMEngine, prompts: list[Any], params: SamplingParams, steps: int) -> float:
    """Median ms of `steps` decode steps, taken once every request has its first token. The prompts
    are prefilled once beforehand, so that the prefix cache lets them all start within a few steps."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"prime{i}", prompt, SamplingParams(max_tokens=1, temperature=0))
    while engine.has_unfinished():
        engine.step()
    waiting = set()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
        waiting.add(f"r{i}")
    while waiting:
        waiting -= {out.request_id for out in engine.step()}
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        outputs = engine.step()
        times.append(time.perf_counter() - started)
        assert len(outputs) == len(prompts), "every row decodes in every timed step"
        assert not any(o.finished for o in outputs), "a row finished inside the timed steps"
    engine.abort_all()
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    levels = [int(level) for level in args.levels.split(",") if level]
    use = ToolUse(TOOLS, "required")
    config = EngineConfig(model=args.model, kv_cache_memory_mb=512, max_num_seqs=max(levels), jump_forward=False)
    loaded = load_model(config.model, config.dtype, config.device)
    engine = LLMEngine(config, loaded)
    kinds = {
        "plain": SamplingParams(max_tokens=48, temperature=0, ignore_eos=True),
        "grammar": SamplingParams(max_tokens=48, temperature=0, grammar=use.grammar),
    }
    warm = conversations(1, use)
    for params in kinds.values():
        step_ms(engine, warm, params, 2)
    rows = []
    for level in levels:
        prompts = conversations(level, use)
        figures: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            for kind, params in kinds.items():
                figures[kind].append(step_ms(engine, prompts, params, args.steps))
        plain, grammar = (statistics.median(figures[kind]) for kind in kinds)
        rows.append({"sequences": level, "plain_step_ms": round(plain, 2), "grammar_step_ms": round(grammar, 2)})
        print(
            f"{level:>3} sequences: plain {plain:.1f} ms, grammar {grammar:.1f} ms, x{grammar / plain:.3f}", flush=True
        )
    report = {"model": args.model, "threads": args.threads, "load_average": os.getloadavg(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
