"""What constrained decoding costs per output token: TPOT with and without a grammar, on mcpmux's engine
and on HF transformers generating with the same grammar library as a logits processor.

The grammar is a tool call as MCP sampling and `/v1` tools ask for it (`serving.tool_calls`,
`required` over two tools with small JSON schemas); the unconstrained requests generate the same
number of tokens (eos ignored). mcpmux runs the constrained requests twice: with jump-forward (the
tokens the grammar forces are appended without a step of their own, the default) and without.
Every request of a level is sent at once (1, 16, 64 concurrent); TPOT = (end - first token) /
(tokens - 1) per request, median over the requests.

- mcpmux: the async `Engine` (continuous batching; llguidance masks the constrained rows each step);
- hf: `model.generate` on one left-padded static batch of that many prompts, with an llguidance
  `LogitsProcessor` (a matcher per row, consume the last token, fill the bitmask, apply it): the
  code a user of transformers would write. Its TPOT is the median time between two steps' logits.

    python benchmarks/structured.py                   # builtin SmolLM2-135M on CPU (~5 min on 2 cores)
    python benchmarks/structured.py --quick           # tiny random model, a smoke run

Prints a table and writes JSON (benchmarks/results/structured.json). Ratios are what to read on a
shared machine: constrained TPOT over plain TPOT, per system and concurrency (with and without
jump-forward for mcpmux).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mcpmux.inference.engine.async_engine import Engine  # noqa: E402
from mcpmux.inference.engine.config import EngineConfig, SamplingParams  # noqa: E402
from mcpmux.inference.serving.tool_calls import ToolSpec, ToolUse  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "structured.json"
TOOLS = (
    ToolSpec(
        "weather",
        "The weather forecast for a city.",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        "add",
        "Add two small numbers.",
        {
            "type": "object",
            "properties": {"a": {"type": "integer", "maximum": 999}, "b": {"type": "integer", "maximum": 999}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    ),
)
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Dakar"]


def conversations(n: int, use: ToolUse) -> list[list[dict[str, str]]]:
    questions = [f"What is the weather in {CITIES[i % len(CITIES)]} for the next {1 + i % 7} days?" for i in range(n)]
    return [use.with_tools([{"role": "user", "content": q}]) for q in questions]


async def mcpmux_tpot(engine: Engine, prompts: list[Any], params: SamplingParams) -> tuple[float, float]:
    """Median TPOT (s) and mean output tokens of `prompts` sent at once."""
    tpots: list[float] = []
    counts: list[int] = []

    async def one(prompt: Any) -> None:
        first = end = 0.0
        tokens = 0
        async for out in engine.generate(prompt, params):
            tokens = out.completion_tokens or tokens + len(out.token_ids)
            now = time.perf_counter()
            first = first or now
            end = now
        counts.append(tokens)
        if tokens > 1:
            tpots.append((end - first) / (tokens - 1))

    async with anyio.create_task_group() as tg:
        for prompt in prompts:
            tg.start_soon(one, prompt)
    return statistics.median(tpots), statistics.mean(counts)


class GuidanceProcessor:
    """An llguidance logits processor for HF `generate`: one matcher per row."""

    def __init__(self, matchers: list[Any], vocab_size: int) -> None:
        import llguidance.torch as llt

        self.llt = llt
        self.matchers = matchers
        self.bitmask = llt.allocate_token_bitmask(len(matchers), vocab_size)
        self.prompt_len: int | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        elif input_ids.shape[1] > self.prompt_len:
            for row, matcher in enumerate(self.matchers):
                if not matcher.is_stopped():
                    matcher.consume_token(int(input_ids[row, -1]))
        for row, matcher in enumerate(self.matchers):
            self.llt.fill_next_token_bitmask(matcher, self.bitmask, row)
        self.llt.apply_token_bitmask_inplace(scores, self.bitmask)
        return scores


class StepClock:
    """The last logits processor of a `generate` call: notes when each step's logits are done."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


def hf_tpot(model: Any, tokenizer: Any, prompts: list[Any], new_tokens: int, grammar: str | None) -> tuple[float, int]:
    """TPOT (s) of one static batch and the steps it ran: the median time between two steps' logits
    (one decode step each, masks included), as a streaming client would see tokens arrive."""
    import llguidance
    import llguidance.hf

    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    vocab = model.config.vocab_size
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)

    def run(limit: int) -> StepClock:
        clock = StepClock()
        kwargs: dict[str, Any] = {"max_new_tokens": limit, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
        if grammar is not None:
            pristine = llguidance.LLMatcher(lltok, grammar, log_level=0)
            kwargs["logits_processor"] = [GuidanceProcessor([pristine.deep_copy() for _ in prompts], vocab), clock]
        else:
            kwargs["min_new_tokens"] = limit
            kwargs["logits_processor"] = [clock]
        with torch.inference_mode():
            model.generate(**batch, **kwargs)
        return clock

    run(2)  # warm-up: the first generate of a shape pays for allocations
    times = run(new_tokens).times
    return statistics.median(b - a for a, b in pairwise(times)), len(times)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    use = ToolUse(TOOLS, "required")
    grammar = use.grammar
    assert grammar is not None
    constrained = SamplingParams(max_tokens=args.max_tokens, temperature=0, grammar=grammar)
    config = EngineConfig(model=args.model, kv_cache_memory_mb=args.kv_mb, max_num_seqs=max(args.concurrency))
    measured: dict[int, dict[str, float]] = {level: {} for level in args.concurrency}
    for jump in (True, False):
        async with await Engine.start(replace(config, jump_forward=jump)) as engine:
            # Warm-up, both kinds: the grammar's tokenizer conversion and compile, and the forward's
            # first use of each shape (a plain decode row first seen inside a timed run cost seconds).
            warm = conversations(1, use)[0]
            await engine.complete(warm, constrained)
            await engine.complete(warm, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
            for level in args.concurrency:
                prompts = conversations(level, use)
                tpot, tokens = await mcpmux_tpot(engine, prompts, constrained)
                figures = measured[level]
                figures["grammar" if jump else "grammar_no_jf"] = tpot
                if jump:
                    plain = SamplingParams(max_tokens=max(2, round(tokens)), temperature=0, ignore_eos=True)
                    figures["plain"], _ = await mcpmux_tpot(engine, prompts, plain)
                    figures["tokens"] = tokens
                    print(f"mcpmux {level:>3} concurrent: {_ms(figures)}", flush=True)
    rows = [_row("mcpmux", level, figures) for level, figures in measured.items()]
    if args.hf_concurrency:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = _model_folder(args.model)
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for level in args.hf_concurrency:
            prompts = conversations(level, use)
            tpot_c, steps = hf_tpot(model, tokenizer, prompts, args.max_tokens, grammar.source)
            tpot_p, _ = hf_tpot(model, tokenizer, prompts, steps, None)
            figures = {"plain": tpot_p, "grammar": tpot_c, "tokens": steps}
            print(f"hf     {level:>3} concurrent: {_ms(figures)}", flush=True)
            rows.append(_row("hf+llguidance", level, figures))
    return {
        "model": args.model,
        "threads": args.threads,
        "load_average": os.getloadavg(),
        "grammar": "tool call, required over 2 tools (serving.tool_calls)",
        "rows": rows,
    }


def _ms(figures: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1000:.1f} ms" if k != "tokens" else f"{v:.1f} tokens" for k, v in figures.items())


def _model_folder(spec: str) -> str:
    if spec.startswith("builtin:"):
        from mcpmux.inference.models import builtin

        return str(builtin.ensure_converted(spec.removeprefix("builtin:")))
    return spec


def _row(system: str, level: int, figures: dict[str, float]) -> dict[str, Any]:
    plain, grammar, no_jf = figures["plain"], figures["grammar"], figures.get("grammar_no_jf")
    return {
        "system": system,
        "concurrency": level,
        "tokens": round(figures["tokens"], 1),
        "tpot_plain_ms": round(plain * 1000, 2),
        "tpot_grammar_ms": round(grammar * 1000, 2),
        "tpot_grammar_no_jump_forward_ms": round(no_jf * 1000, 2) if no_jf is not None else None,
        "grammar_over_plain": round(grammar / plain, 3),
        "no_jump_forward_over_plain": round(no_jf / plain, 3) if no_jf is not None else None,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("system", "conc", "tokens", "plain ms", "grammar ms", "no-JF ms", "ratio", "no-JF")
    print(f"{head[0]:<14} {head[1]:>4} {head[2]:>6} {head[3]:>9} {head[4]:>10} {head[5]:>9} {head[6]:>6} {head[7]:>6}")
    for r in rows:
        no_jf = r["tpot_grammar_no_jump_forward_ms"]
        no_jf_ratio = r["no_jump_forward_over_plain"]
        print(
            f"{r['system']:<14} {r['concurrency']:>4} {r['tokens']:>6} {r['tpot_plain_ms']:>9.1f} "
            f"{r['tpot_grammar_ms']:>10.1f} {'-' if no_jf is None else f'{no_jf:.1f}':>9} "
            f"{r['grammar_over_plain']:>6.2f} {'-' if no_jf_ratio is None else f'{no_jf_ratio:.2f}':>6}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--concurrency", default="1,16,64", help="mcpmux levels, comma-separated")
    parser.add_argument("--hf-concurrency", default="1,16", help="HF levels (empty: skip HF)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-mb", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="a tiny random model (smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.hf_concurrency = [int(c) for c in args.hf_concurrency.split(",") if c]
    with tempfile.TemporaryDirectory() as scratch:
        if args.quick:
            from tests.inference.tiny_models import build_tiny_model

            args.model = str(build_tiny_model("llama", Path(scratch) / "tiny"))
            args.concurrency, args.hf_concurrency, args.kv_mb = [1, 4], [1, 4], 16
        report = anyio.run(measure, args)
    print_table(report["rows"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
