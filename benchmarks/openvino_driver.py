"""OpenVINO GenAI's `ContinuousBatchingPipeline`, driven by `benchmarks/engine.py` from the peer's own venv.

    benchmarks/.peers/openvino/bin/python benchmarks/openvino_driver.py --model IR_DIR --precision f32

Runs in the virtual environment `benchmarks/setup_openvino.sh` builds, so mcpmux's environment never
imports openvino. It loads the pipeline once, answers one JSON line on stdout when it is ready
(`{"ready": true}` or `{"error": "..."}`), then reads one workload per line on stdin,
`{"reqs": [[arrival_s, [prompt ids], max_tokens], ...]}`, runs it (each request admitted at its
arrival, greedy, exactly max_tokens tokens) and answers `{"times": [[token times]], "tokens":
[[ids]], "cpu_s": ...}`, times in seconds from the workload's start. Anything the libraries print goes
to stderr, so stdout carries only these answers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

import numpy as np
import openvino as ov
import openvino_genai as ov_genai


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pipeline(args: argparse.Namespace) -> ov_genai.ContinuousBatchingPipeline:
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    scheduler.max_num_seqs = args.max_num_seqs
    scheduler.max_num_batched_tokens = args.max_batched_tokens
    scheduler.cache_size = args.cache_gb
    properties = {
        "INFERENCE_PRECISION_HINT": args.precision,
        "KV_CACHE_PRECISION": args.precision,
        "INFERENCE_NUM_THREADS": args.threads,
    }
    return ov_genai.ContinuousBatchingPipeline(args.model, scheduler, "CPU", properties)


def greedy(max_tokens: int) -> ov_genai.GenerationConfig:
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = max_tokens
    config.min_new_tokens = max_tokens
    config.ignore_eos = True
    config.do_sample = False
    return config


def run(pipe: ov_genai.ContinuousBatchingPipeline, reqs: list[list[Any]]) -> dict[str, Any]:
    """Admit each request at its arrival, step until all finish; token times from the start."""
    order = sorted(range(len(reqs)), key=lambda i: reqs[i][0])
    times: list[list[float]] = [[] for _ in reqs]
    tokens: list[list[int]] = [[] for _ in reqs]
    handles: dict[int, Any] = {}
    cpu = cpu_seconds()
    start = time.perf_counter()
    nxt = 0
    while nxt < len(order) or pipe.has_non_finished_requests():
        now = time.perf_counter() - start
        while nxt < len(order) and reqs[order[nxt]][0] <= now:
            i = order[nxt]
            prompt = ov.Tensor(np.array([reqs[i][1]], dtype=np.int64))
            handles[i] = pipe.add_request(i, prompt, greedy(int(reqs[i][2])))
            nxt += 1
        if not pipe.has_non_finished_requests():
            time.sleep(max(0.0, reqs[order[nxt]][0] - now))
            continue
        pipe.step()
        stamp = time.perf_counter() - start
        for i, handle in handles.items():
            while handle.can_read():
                for output in handle.read().values():
                    tokens[i] += list(output.generated_ids)
                    times[i] += [stamp] * len(output.generated_ids)
    return {"times": times, "tokens": tokens, "cpu_s": cpu_seconds() - cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the OpenVINO IR folder setup_openvino.sh exported")
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-batched-tokens", type=int, default=512)
    ap.add_argument("--cache-gb", type=int, default=1)
    args = ap.parse_args()
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    try:
        pipe = pipeline(args)
        run(pipe, [[0.0, [1, 2, 3], 2]])  # warm-up
    except Exception as err:
        answer({"error": f"{type(err).__name__}: {' '.join(str(err).split())[-400:]}"})
        return
    answer({"ready": True})
    for line in sys.stdin:
        answer(run(pipe, json.loads(line)["reqs"]))


if __name__ == "__main__":
    main()
