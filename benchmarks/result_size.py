"""How many tokens a tool result's bytes cost a model, and what the result-size limit costs mcpmux.

    python benchmarks/result_size.py [--json OUT]

The default of `[mux] max_result_bytes` rests on this. Real results are fetched through a `Mux`
(no limit) from the npm reference filesystem server: this repository's README (prose), a Python
module (code), `.npm/package-lock.json` (JSON), the `directory_tree` of `mcpmux/` (dense JSON) and a
directory listing with sizes (short lines). Each is counted in UTF-8 bytes and in tokens of
SmolLM2's byte-level BPE (49k vocabulary, GPT-2 family; the tokenizers of the models clients run
are not public, so this is a proxy). The table gives bytes per token per kind, the tokens a
result of the default limit costs for the densest kind, against Claude Code's refusal of a result
over 25,000 tokens, and the time the limit costs: `fits` on a small result (every call pays it) and
`fit` on a 4 MB one (only cut results pay it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import timeit
from pathlib import Path
from typing import Any

import anyio
from tokenizers import Tokenizer

from mcpmux import Mux
from mcpmux.core.config import DEFAULT_MAX_RESULT_BYTES, config_from_dict
from mcpmux.core.result_limit import fit, fits
from mcpmux.inference.models import builtin

ROOT = Path(__file__).resolve().parents[1]
FILESYSTEM = ROOT / ".npm" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
CLAUDE_CODE_REFUSAL = 25_000
"""Tokens past which Claude Code refuses an MCP tool result (its MAX_MCP_OUTPUT_TOKENS default)."""

CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("prose (README.md)", "read_text_file", {"path": str(ROOT / "README.md")}),
    ("code (fast_path.py)", "read_text_file", {"path": str(ROOT / "mcpmux" / "mux" / "fast_path.py")}),
    ("JSON (package-lock.json)", "read_text_file", {"path": str(ROOT / ".npm" / "package-lock.json")}),
    ("JSON tree (directory_tree)", "directory_tree", {"path": str(ROOT / "mcpmux")}),
    ("listing (list_directory_with_sizes)", "list_directory_with_sizes", {"path": str(ROOT / "mcpmux" / "mux")}),
]


async def fetch_results() -> list[tuple[str, str]]:
    """(kind, the result's text) for each of `CALLS`, through a Mux with no result limit."""
    config = config_from_dict(
        {
            "servers": {"fs": {"command": "node", "args": [str(FILESYSTEM), str(ROOT)]}},
            "mux": {"max_result_bytes": 0},
            "inference": {"backend": "off"},
        }
    )
    texts = []
    async with Mux(config) as mux:
        for kind, tool, arguments in CALLS:
            result = await mux.call_tool(f"fs__{tool}", arguments)
            if result.is_error:
                raise SystemExit(f"{tool} failed: {result.content}")
            texts.append((kind, "".join(getattr(block, "text", "") for block in result.content)))
    return texts


def tokenizer() -> Tokenizer:
    folder = builtin.ensure_converted("smollm2-135m")
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def costs() -> dict[str, float]:
    """Microseconds per `fits` on a small result, milliseconds per `fit` of a 4 MB one."""
    small = {"content": [{"type": "text", "text": "x" * 2000}], "isError": False}
    line = "".join(f"{i:06d} GET /api/items/{i} 200 {i % 97} ms\n" for i in range(100_000))[: 4 * 1024 * 1024]
    large = {"content": [{"type": "text", "text": line}], "isError": False}
    limit = DEFAULT_MAX_RESULT_BYTES
    small_us = min(timeit.repeat(lambda: fits(small, limit, False), number=100_000, repeat=5)) / 100_000 * 1e6
    large_ms = min(timeit.repeat(lambda: fit(large, limit, False, "t", lambda: "u"), number=5, repeat=3)) / 5 * 1e3
    return {"fits_small_us": small_us, "fit_4mb_ms": large_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if shutil.which("node") is None or not FILESYSTEM.exists():
        raise SystemExit("needs node and the npm servers: run `make setup` first")
    texts = anyio.run(fetch_results)
    tok = tokenizer()
    rows = []
    print(f"{'result':38} {'bytes':>9} {'tokens':>8} {'bytes/token':>12}")
    for kind, text in texts:
        size, tokens = len(text.encode()), len(tok.encode(text).ids)
        rows.append({"kind": kind, "bytes": size, "tokens": tokens, "bytes_per_token": size / tokens})
        print(f"{kind:38} {size:9,} {tokens:8,} {size / tokens:12.2f}")
    densest = min(row["bytes_per_token"] for row in rows)
    at_limit = DEFAULT_MAX_RESULT_BYTES / densest
    print(
        f"\ndefault max_result_bytes {DEFAULT_MAX_RESULT_BYTES:,}: at most {at_limit:,.0f} tokens "
        f"(densest kind, {densest:.2f} bytes/token); Claude Code refuses over {CLAUDE_CODE_REFUSAL:,}"
    )
    timing = costs()
    small, large = timing["fits_small_us"], timing["fit_4mb_ms"]
    print(f"fits() on a 2 KB result: {small:.2f} µs; fit() cutting a 4 MB one: {large:.1f} ms")
    if args.json:
        report = {"rows": rows, "default": DEFAULT_MAX_RESULT_BYTES, "tokens_at_default": at_limit, **timing}
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
