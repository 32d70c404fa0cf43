"""llguidance against xgrammar on the same JSON schemas and tokenizer: what a grammar costs to compile
and what a token mask costs to fill, one request at a time and 64 at once, plus what mcpmux adds to
turn 64 bitmasks into logit biases and apply them (`engine.grammar.MaskFiller`, `engine.sampler`).

Both libraries get the same layout (one line, ", " and ": ") and walk the same tokens: a valid
instance of each schema, tokenized by the model's tokenizer. Per token a matcher fills its mask,
then takes the token. For 64 requests at once, each somewhere along its instance, the masks are
filled by the library's batch call (its own threads) and one by one. Compile times are cold (no
cache); the tokenizer conversion is timed apart, as each engine pays it once.

    pip install xgrammar                       # the peer; not a dependency of mcpmux
    python benchmarks/structured_libs.py       # builtin SmolLM2-135M's tokenizer (49,152 tokens)

Prints a table and writes JSON (benchmarks/results/structured_libs.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.structured import TOOLS, _model_folder  # noqa: E402
from mcpmux.inference.engine.grammar import JSON_LAYOUT, GrammarMatcher, MaskFiller  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "structured_libs.json"
BATCH = 64
ORDER = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "email": {"type": "string", "pattern": "^[a-z.]+@[a-z]+\\.[a-z]{2,3}$"},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "email", "vip"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price": {"type": "number"},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
            "maxItems": 10,
        },
        "shipping": {"enum": ["standard", "express", "pickup"]},
        "note": {"type": ["string", "null"]},
    },
    "required": ["customer", "items", "shipping", "note"],
    "additionalProperties": False,
}
_CALL = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.schema},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in TOOLS
    ]
}
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "weather arguments": (TOOLS[0].schema, {"city": "Buenos Aires", "days": 5}),
    "tool call (2 tools)": (_CALL, {"name": "add", "arguments": {"a": 417, "b": 38}}),
    "order (nested, arrays)": (
        ORDER,
        {
            "customer": {"name": "Ada Lovelace", "email": "ada.l@example.org", "vip": True},
            "items": [
                {"sku": "ABC-1234", "quantity": 2, "price": 19.99},
                {"sku": "XYZ-0042", "quantity": 12, "price": 3.5},
                {"sku": "QRS-7777", "quantity": 1, "price": 249.0},
            ],
            "shipping": "express",
            "note": "Leave the parcel with the neighbour if nobody answers the door.",
        },
    ),
}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


class Guidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf

        self.lib = llguidance
        self.vocab = vocab
        self.setup_s, self.tokenizer = timed(lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab))
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.lib.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        matcher = self.lib.LLMatcher(self.tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def fresh(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.shape[1] * 4)

    def consume(self, matcher: Any, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        targets = [(m, row) for row, m in enumerate(matchers)]
        self.executor.unsafe_compute_mask_ptr(targets, bitmask.data_ptr(), bitmask.shape[1] * 4, len(matchers))


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import xgrammar

        self.lib = xgrammar
        self.vocab = vocab
        self.setup_s, info = timed(lambda: xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.batch = xgrammar.BatchGrammarMatcher()

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))

    def fresh(self, compiled: Any) -> Any:
        return self.lib.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(bitmask)

    def consume(self, matcher: Any, token: int) -> None:
        assert matcher.accept_token(token), token

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)


def measure_lib(lib: Any, case: str, schema: dict[str, Any], tokens: list[int], rounds: int) -> dict[str, Any]:
    compiles = [timed(lambda: lib.compile(schema))[0] for _ in range(rounds)]
    compiled = lib.compile(schema)
    bitmask = torch.empty((1, (lib.vocab + 31) // 32), dtype=torch.int32)
    per_token: list[float] = []
    for _ in range(rounds):
        matcher = lib.fresh(compiled)
        for token in tokens:
            per_token.append(timed(lambda m=matcher: lib.fill(m, bitmask))[0])
            lib.consume(matcher, token)
    # 64 requests at once, each somewhere along the instance (the mix a step of a busy engine sees).
    matchers = []
    for i in range(BATCH):
        matcher = lib.fresh(compiled)
        for token in tokens[: i * len(tokens) // BATCH]:
            lib.consume(matcher, token)
        matchers.append(matcher)
    batch_mask = torch.empty((BATCH, bitmask.shape[1]), dtype=torch.int32)
    batch = [timed(lambda: lib.fill_batch(matchers, batch_mask))[0] for _ in range(rounds)]

    def one_by_one() -> None:
        for row, matcher in enumerate(matchers):
            lib.fill(matcher, batch_mask[row : row + 1])

    serial = [timed(one_by_one)[0] for _ in range(rounds)]
    return {
        "library": lib.name,
        "schema": case,
        "tokens": len(tokens),
        "tokenizer_setup_ms": round(lib.setup_s * 1000, 1),
        "compile_ms": round(statistics.median(compiles) * 1000, 2),
        "mask_us_median": round(statistics.median(per_token) * 1e6, 1),
        "mask_us_mean": round(statistics.mean(per_token) * 1e6, 1),
        "mask_us_max": round(max(per_token) * 1e6, 1),
        "batch64_ms": round(statistics.median(batch) * 1000, 2),
        "serial64_ms": round(statistics.median(serial) * 1000, 2),
    }


def measure_mcpmux(guidance: Guidance, schema: dict[str, Any], tokens: list[int], rounds: int) -> dict[str, float]:
    """mcpmux's side of a 64-row step: the worker's fill + unpack to a bias, and the sampler's add."""
    filler = MaskFiller(guidance.vocab)
    compiled = guidance.compile(schema)
    matchers = []
    for i in range(BATCH):
        matcher = compiled.deep_copy()
        for token in tokens[: i * len(tokens) // BATCH]:
            matcher.consume_token(token)
        matchers.append(GrammarMatcher(matcher))
    fills = [timed(lambda: filler.start(matchers).result())[0] for _ in range(rounds)]
    bias = filler.start(matchers).result()
    logits = torch.randn(BATCH, guidance.vocab)
    rows = torch.arange(BATCH)
    applies = [timed(lambda: logits.clone().index_add_(0, rows, bias))[0] for _ in range(rounds)]
    return {
        "fill_and_bias64_ms": round(statistics.median(fills) * 1000, 2),
        "apply64_ms": round(statistics.median(applies) * 1000, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m", help="whose tokenizer (a folder or builtin:NAME)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoConfig, AutoTokenizer

    folder = _model_folder(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab = AutoConfig.from_pretrained(folder).vocab_size
    libs = [Guidance(tokenizer, vocab), XGrammar(tokenizer, vocab)]
    rows, ours = [], {}
    for case, (schema, instance) in CASES.items():
        text = json.dumps(instance, separators=(", ", ": "))
        tokens = tokenizer.encode(text, add_special_tokens=False)
        for lib in libs:
            rows.append(measure_lib(lib, case, schema, tokens, args.rounds))
        ours[case] = measure_mcpmux(libs[0], schema, tokens, args.rounds)
    head = (
        "library",
        "schema",
        "tokens",
        "setup ms",
        "compile ms",
        "mask µs p50",
        "mean",
        "max",
        "64 rows ms",
        "64 one by one",
    )
    print(" | ".join(head))
    for r in rows:
        print(
            f"{r['library']} | {r['schema']} | {r['tokens']} | {r['tokenizer_setup_ms']} | {r['compile_ms']} | "
            f"{r['mask_us_median']} | {r['mask_us_mean']} | {r['mask_us_max']} | {r['batch64_ms']} | {r['serial64_ms']}"
        )
    for case, figures in ours.items():
        print(
            f"mcpmux, 64 rows, {case}: fill + bias {figures['fill_and_bias64_ms']} ms, apply {figures['apply64_ms']} ms"
        )
    report = {"model": args.model, "vocab": vocab, "load_average": os.getloadavg(), "rows": rows, "mcpmux": ours}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
