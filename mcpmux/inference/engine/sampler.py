"""Turns a step's logits into one token per sampled sequence.

Greedy rows take the argmax. Sampled rows apply temperature, then top-k, top-p and min-p on the
sorted distribution, and draw with the request's own `torch.Generator` (the exponential-race trick:
argmax of p / E with E ~ Exp(1), which draws from p). Each request's generator is advanced by
exactly one vocabulary-sized draw per token, so a seeded request samples the same tokens whatever
else shares its batch.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mcpmux.inference import kernels
from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.engine.outputs import TokenLogprob

if TYPE_CHECKING:
    from mcpmux.inference.engine.grammar import GrammarMatcher


@dataclass(slots=True)
class SampleRequest:
    """One row of the logits: how to sample it, with the request's generator (and grammar, if any).

    `mask` is set for the step by the engine on a constrained row: the step's grammar bias
    (`MaskFiller.start`), shared by every constrained row of the step, one bias row each in order."""

    params: SamplingParams
    generator: torch.Generator
    matcher: GrammarMatcher | None = None
    mask: Future[torch.Tensor] | None = None


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A request's private RNG: seeded when the user gave a seed, otherwise from fresh entropy."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def sample(logits: torch.Tensor, requests: list[SampleRequest]) -> SampleResult:
    """Sample one token per row of float32 `logits` [N, vocab]."""
    if not requests:
        return SampleResult([], [])
    scores = logits
    constrained = [row for row, req in enumerate(requests) if req.mask is not None]
    if constrained:  # only these rows change; logprobs still come from the raw logits
        mask = requests[constrained[0]].mask
        assert mask is not None
        bias = mask.result().to(scores.device)  # filled while the forward ran
        scores = logits.clone()
        scores.index_add_(0, torch.tensor(constrained, device=scores.device), bias)
    tokens = kernels.argmax(scores)
    for row, req in enumerate(requests):
        if not req.params.greedy:
            tokens[row] = _sample_row(scores[row], req)
    token_list = [int(t) for t in tokens.tolist()]
    logprobs: list[TokenLogprob | None] = [None] * len(requests)
    wanted = [row for row, req in enumerate(requests) if req.params.logprobs is not None]
    if wanted:
        all_lp = torch.log_softmax(logits[wanted], dim=-1)
        for i, row in enumerate(wanted):
            logprobs[row] = _logprob_of(all_lp[i], token_list[row], requests[row].params.logprobs or 0)
    return SampleResult(token_list, logprobs)


def _sample_row(logits: torch.Tensor, req: SampleRequest) -> int:
    p = req.params
    sorted_logits, order = torch.sort(logits / p.temperature, descending=True)
    if p.top_k > 0:
        sorted_logits[p.top_k :] = float("-inf")
    probs = torch.softmax(sorted_logits, dim=-1)
    if p.top_p < 1.0:
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        before = torch.cumsum(probs, dim=-1) - probs
        probs[before >= p.top_p] = 0.0
    if p.min_p > 0.0:
        probs[probs < p.min_p * probs[0]] = 0.0
    noise = torch.empty_like(probs).exponential_(generator=req.generator)
    return int(order[torch.argmax(probs / noise)])


def _logprob_of(logprobs: torch.Tensor, token_id: int, top_n: int) -> TokenLogprob:
    result = TokenLogprob(token_id, float(logprobs[token_id]))
    if top_n:
        values, ids = torch.topk(logprobs, top_n)
        result.top = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return result
