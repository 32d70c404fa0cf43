"""Turns a step's logits into one token per sampled sequence.

Greedy rows take the argmax. Sampled rows apply temperature, then top-k, top-p and min-p on the
sorted distribution, and draw with the request's own `torch.Generator`: one uniform number a token,
placed on the running sum of the kept probabilities. The distribution is sorted only as far as the
filters reach: the step's sampled rows take their `CANDIDATES` most likely tokens at once (a top-k,
not a sort of the whole vocabulary: 2.7 ms a row here), and a row whose filters might keep a token
past them is sorted whole; a row with no filter draws over the whole vocabulary unsorted. What a row
draws depends on that row alone (its probabilities are computed row by row, its generator advances
by one number a token), so a seeded request samples the same tokens whatever else shares its batch.
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

CANDIDATES = 256
"""How many of a sampled row's most likely tokens are taken first: top-p and min-p rarely reach further."""


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
    token_list = [int(t) for t in kernels.argmax(scores).tolist()]
    sampled = [row for row, req in enumerate(requests) if not req.params.greedy]
    if sampled:
        for row, token in zip(sampled, _sample_rows(scores[sampled], [requests[r] for r in sampled]), strict=True):
            token_list[row] = token
    logprobs: list[TokenLogprob | None] = [None] * len(requests)
    wanted = [row for row, req in enumerate(requests) if req.params.logprobs is not None]
    if wanted:
        all_lp = torch.log_softmax(logits[wanted], dim=-1)
        for i, row in enumerate(wanted):
            logprobs[row] = _logprob_of(all_lp[i], token_list[row], requests[row].params.logprobs or 0)
    return SampleResult(token_list, logprobs)


def _sample_rows(scores: torch.Tensor, requests: list[SampleRequest]) -> list[int]:
    """One token for each row of `scores` (the sampled rows' logits), drawn as the module doc says."""
    temperatures = torch.tensor([req.params.temperature for req in requests], dtype=scores.dtype)
    scaled = scores / temperatures.unsqueeze(1)
    width = min(scaled.shape[1], max(CANDIDATES, *(req.params.top_k for req in requests)))
    values, order = torch.topk(scaled, width, dim=1)  # each row's most likely tokens, most likely first
    probs = torch.softmax(scaled, dim=1)  # row by row, each on one thread: the same alone or batched
    return [_draw(scaled[i], probs[i], values[i], order[i], req) for i, req in enumerate(requests)]


def _draw(row: torch.Tensor, probs: torch.Tensor, values: torch.Tensor, order: torch.Tensor,
          req: SampleRequest) -> int:  # fmt: skip
    """A token of `row` (temperature applied; `probs` its distribution) under the request's filters, from its
    most likely `values` at `order`."""
    p = req.params
    if p.top_k > 0:  # the candidates hold the top k: the distribution renormalised over them
        probs, order = torch.softmax(values[: p.top_k], dim=-1), order[: p.top_k]
    elif p.top_p >= 1.0 and p.min_p == 0.0:  # no filter: the whole vocabulary, in its own order
        return _pick(probs, req.generator)
    else:  # the first CANDIDATES whatever the batch's widest top-k, so the draw depends on this row alone
        whole, order = probs, order[:CANDIDATES]
        probs = whole[order]
        if not _cut_within(probs, p):  # the filters may keep a token past the candidates: sort them all
            order = torch.sort(row, descending=True).indices
            probs = whole[order]
    if p.top_p < 1.0:
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        before = torch.cumsum(probs, dim=-1) - probs
        probs[before >= p.top_p] = 0.0
    if p.min_p > 0.0:
        probs[probs < p.min_p * probs[0]] = 0.0
    return int(order[_pick(probs, req.generator)])


def _pick(probs: torch.Tensor, generator: torch.Generator) -> int:
    """An index of `probs` (not all zero) drawn with probability probs[i] / their sum: one uniform draw from
    the request's generator against the running sum (in float64, so that even the last of 49,152 tokens keeps
    its own probability). A token of probability 0 never comes out: its running sum equals the one before."""
    cumulative = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    point = torch.rand(1, generator=generator, dtype=torch.float64) * cumulative[-1]
    return min(int(torch.searchsorted(cumulative, point, right=True)), probs.numel() - 1)


def _cut_within(probs: torch.Tensor, p: SamplingParams) -> bool:
    """Whether top-p or min-p drops every token after these, the most likely ones with their probabilities."""
    reaches_top_p = p.top_p < 1.0 and float(torch.cumsum(probs, dim=-1)[-1]) >= p.top_p  # as the filter sums
    below_min_p = p.min_p > 0.0 and float(probs[-1]) < p.min_p * float(probs[0])
    return reaches_top_p or below_min_p


def _logprob_of(logprobs: torch.Tensor, token_id: int, top_n: int) -> TokenLogprob:
    result = TokenLogprob(token_id, float(logprobs[token_id]))
    if top_n:
        values, ids = torch.topk(logprobs, top_n)
        result.top = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    return result
