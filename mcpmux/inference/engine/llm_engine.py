"""The synchronous engine core: add requests, step, abort. One step is
`scheduler.schedule()` -> `model_runner.run()` -> `scheduler.postprocess()`, then detokenization."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mcpmux.inference.engine.config import EngineConfig, Grammar, SamplingParams
from mcpmux.inference.engine.detokenizer import IncrementalDetokenizer
from mcpmux.inference.engine.model_runner import ModelRunner, kv_block_bytes
from mcpmux.inference.engine.sampler import SampleRequest, TokenLogprob, make_generator
from mcpmux.inference.engine.scheduler import Scheduler
from mcpmux.inference.engine.sequence import Sequence
from mcpmux.inference.engine.stats import EngineStats, StatsCollector
from mcpmux.inference.models.loader import LoadedModel, load_model

if TYPE_CHECKING:
    import torch

    from mcpmux.inference.engine.grammar import GrammarCompiler, GrammarMatcher, MaskFiller

log = logging.getLogger(__name__)

Prompt = str | list[dict[str, str]] | list[int]


@dataclass(slots=True)
class RequestOutput:
    """What one request gained in one step (a delta); the last one has `finished` set."""

    request_id: str
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    sample: SampleRequest
    arrival_time: float
    first_token_time: float | None = None


class LLMEngine:
    """Continuous batching over one model, driven by whoever calls `step` (one thread at a time)."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded or load_model(config.model, config.dtype, config.device)
        num_blocks = config.num_blocks or max(
            1, config.kv_cache_memory_mb * 2**20 // kv_block_bytes(self.loaded, config.block_size)
        )
        max_len = min(config.max_model_len or self.loaded.max_position, self.loaded.max_position)
        self.runner = ModelRunner(
            self.loaded,
            config.block_size,
            num_blocks,
            cuda_graphs=config.cuda_graphs,
            max_num_seqs=config.max_num_seqs,
            cpu_threads=config.cpu_threads,
        )
        self.scheduler = Scheduler(config, num_blocks, self.loaded.eos_token_ids, max_len)
        self.stats_collector = StatsCollector()
        self._requests: dict[str, _Request] = {}
        self._grammar_compiler: GrammarCompiler | None = None
        self._mask_filler: MaskFiller | None = None
        self._grammar_lock = threading.Lock()

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a plain prompt, chat messages (via the chat template) or ids as given."""
        if isinstance(prompt, str):
            return self.loaded.encode_prompt(prompt)
        if prompt and isinstance(prompt[0], dict):
            return self.loaded.encode_chat(prompt)
        if not prompt:
            raise ValueError("the prompt is empty; give a string, chat messages or token ids")
        return [int(t) for t in prompt]  # type: ignore[arg-type]

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        matcher: GrammarMatcher | None = None,
    ) -> None:
        """Queue a request; raises `RequestTooLargeError`, `QueueFullError` or `ValueError`.

        A request with a grammar uses `matcher` when one was compiled beforehand (`compile_grammar`,
        off the step loop), else its grammar is compiled here."""
        token_ids = self.encode(prompt)
        if params.grammar is not None and matcher is None:
            matcher = self.compile_grammar(params.grammar)
        seq = Sequence(request_id, token_ids, len(token_ids), params, priority=priority)
        try:
            self.scheduler.add(seq)
        except Exception:
            self.stats_collector.requests_rejected += 1
            raise
        generator = make_generator(params.seed, self.loaded.device)
        self._requests[request_id] = _Request(
            seq,
            IncrementalDetokenizer(self.loaded.tokenizer, token_ids, params.stop),
            SampleRequest(params, generator, matcher),
            time.perf_counter() if arrival_time is None else arrival_time,
        )

    def compile_grammar(self, grammar: Grammar) -> GrammarMatcher:
        """A matcher for a request's grammar (safe from any thread); `InvalidSettingError` if unusable."""
        with self._grammar_lock:
            if self._grammar_compiler is None:
                # Imported here: llguidance loads with the first constrained request.
                from mcpmux.inference.engine.grammar import GrammarCompiler, MaskFiller

                self._grammar_compiler = GrammarCompiler(self.loaded.tokenizer, self.loaded.vocab_size)
                self._mask_filler = MaskFiller(self.loaded.vocab_size)
            compiler = self._grammar_compiler
        return compiler.matcher(grammar)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the deltas of every request that produced text or ended."""
        started = time.perf_counter()
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        requests = [self._requests[item.seq.request_id].sample for item in out.scheduled if item.samples]
        masks = self._start_masks(requests)
        try:
            result = self.runner.run(out.scheduled, requests)
        finally:
            if masks is not None:
                wait([masks])  # the matchers are only advanced once their masks are filled
        logprobs = {item.seq.request_id: lp for item, lp in zip(out.scheduled, result.logprobs, strict=True) if lp}
        advanced = self.scheduler.postprocess(out, result.token_ids)
        now = time.perf_counter()
        outputs = [self._emit(seq, logprobs.get(seq.request_id), now) for seq in advanced]
        self.stats_collector.on_step(len(out.scheduled), out.num_batched_tokens, len(advanced), now - started)
        return outputs

    def _start_masks(self, requests: list[SampleRequest]) -> Future[torch.Tensor] | None:
        """Start filling the constrained rows' masks, to overlap the forward pass; None without any."""
        constrained = [req for req in requests if req.matcher is not None]
        if not constrained:
            return None
        assert self._mask_filler is not None  # made with the first matcher
        masks = self._mask_filler.start([req.matcher for req in constrained if req.matcher is not None])
        for req in constrained:
            req.mask = masks
        return masks

    def abort(self, request_id: str) -> RequestOutput | None:
        """Abort a request; returns its final output, or None when it is unknown or already done."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return None
        return self._final(self._requests[request_id], RequestOutput(request_id, "", []), time.perf_counter())

    def abort_all(self) -> list[RequestOutput]:
        outputs = [self.abort(rid) for rid in list(self._requests)]
        return [o for o in outputs if o is not None]

    def stats(self) -> EngineStats:
        """A snapshot of queues, KV usage, prefix caching and latency figures."""
        sched, bm = self.scheduler, self.scheduler.block_manager
        snap = EngineStats(
            running=len(sched.running),
            waiting=len(sched.waiting),
            num_blocks=bm.num_blocks,
            kv_usage=bm.usage,
            prompt_tokens=sched.prefix_query_tokens,
            cached_prompt_tokens=sched.prefix_hit_tokens,
            prefix_hit_rate=sched.prefix_hit_tokens / sched.prefix_query_tokens if sched.prefix_query_tokens else 0,
            num_preemptions=sched.num_preemptions,
        )
        return self.stats_collector.snapshot(snap)

    def _emit(self, seq: Sequence, logprob: TokenLogprob | None, now: float) -> RequestOutput:
        req = self._requests[seq.request_id]
        token = seq.token_ids[-1]
        if req.first_token_time is None:
            req.first_token_time = now
            self.stats_collector.on_first_token(now - req.arrival_time)
        out = RequestOutput(seq.request_id, "", [token], logprobs=[logprob] if logprob else [])
        # A token that ended the request by id (eos, stop_token_ids) adds no text.
        if not (seq.is_finished and seq.finish_reason == "stop"):
            out.text = req.detokenizer.add(token)
            matcher = req.sample.matcher
            if matcher is not None:
                matcher.consume(token)
            if matcher is not None and self.config.jump_forward and seq.params.logprobs is None:
                self._jump_forward(req, out)
            if req.detokenizer.stopped or (matcher is not None and matcher.done):
                # A stop string (or a complete grammar) on the very last allowed token still counts as a
                # stop, not a length cut.
                seq.finish_reason = "stop" if seq.is_finished else seq.finish_reason
                self.scheduler.finish(seq, "stop")
            elif not seq.is_finished and seq.num_output_tokens >= seq.max_tokens:
                self.scheduler.finish(seq, "length")  # reached by forced tokens
        return self._final(req, out, now) if seq.is_finished else out

    def _jump_forward(self, req: _Request, out: RequestOutput) -> None:
        """Append the tokens the grammar forces next, unsampled: the next step computes them all in one
        forward pass (and samples after them) instead of one step each."""
        seq, matcher = req.seq, req.sample.matcher
        assert matcher is not None
        if seq.is_finished or req.detokenizer.stopped or matcher.done:
            return
        for token in matcher.forced()[: seq.max_tokens - seq.num_output_tokens]:
            seq.token_ids.append(token)
            out.token_ids.append(token)
            out.text += req.detokenizer.add(token)
            matcher.consume(token)
            if req.detokenizer.stopped or matcher.done:
                return

    def _final(self, req: _Request, out: RequestOutput, now: float) -> RequestOutput:
        seq = req.seq
        out.text += req.detokenizer.flush()
        out.finished = True
        out.finish_reason = seq.finish_reason
        out.prompt_tokens = seq.num_prompt_tokens
        out.cached_prompt_tokens = max(seq.num_cached_tokens, 0)
        out.completion_tokens = seq.num_output_tokens
        decode = now - req.first_token_time if req.first_token_time is not None else 0.0
        self.stats_collector.on_finish(seq.finish_reason or "abort", decode, seq.num_output_tokens)
        del self._requests[seq.request_id]
        return out
