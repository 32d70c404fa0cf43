"""Turns a step's logits into one token per sampled sequence.

Greedy rows take the argmax. Sampled rows apply temperature, then top-k, top-p and min-p on the
sorted distribution, and draw with the request's own `torch.Generator`: one uniform number a token,
placed on the running sum of the kept probabilities. The distribution is sorted only as far as the
filters reach: the step's rows with a filter take their `CANDIDATES` most likely tokens at once
(`kernels.top_k`, one pass over each row: 2.5 ms for 32 rows of 49,152 here, where `torch.topk` took
6.7 ms and a sort of one row 2.7 ms), and their filters and draws run on those rows together; a row
whose filters might keep a token past them takes its `WIDER` most likely tokens, and is sorted whole
only if the filters reach past those too. A row with no filter draws over the whole vocabulary
unsorted: where the fused kernels run, in one call for all such rows (`kernels.sample_rows`: the
softmax, the float64 running sum and the search fused, a row a pool thread), else with torch. What a
row draws depends on that row alone (its numbers are computed row by row, as wide whatever else the
batch holds, and its generator advances by one number a token), so a seeded request samples the same
tokens whatever else shares its batch.
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


WIDER = 4096
"""How many most likely tokens a row takes when its filters reach past the first `CANDIDATES`, before it is
sorted whole: 0.8 ms a row of 49,152 against 2.7 ms for the sort (on flat distributions, top-p 0.95 at
temperature 0.7 kept up to 2,597 tokens)."""


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
    token_list = [0] * len(requests)
    greedy = [row for row, req in enumerate(requests) if req.params.greedy]
    if greedy:  # the argmax of these rows only: a 32-row one takes 0.25 ms
        chosen = scores if len(greedy) == len(requests) else scores[greedy]
        for row, token in zip(greedy, kernels.argmax(chosen).tolist(), strict=True):
            token_list[row] = int(token)
    sampled = [row for row, req in enumerate(requests) if not req.params.greedy]
    plain = [row for row in sampled if not _filtered(requests[row].params)]
    picked = plain and kernels.sample_rows(
        scores, plain, [requests[r].params.temperature for r in plain], [requests[r].generator for r in plain]
    )
    if picked:  # the rows with no filter, drawn by the fused kernels in one pass each
        for row, token in zip(plain, picked, strict=True):
            token_list[row] = token
        sampled = [row for row in sampled if _filtered(requests[row].params)]
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
    probs = torch.softmax(scaled, dim=1)  # row by row, each on one thread: the same alone or batched
    tokens = [0] * len(requests)
    filtered = [i for i, req in enumerate(requests) if _filtered(req.params)]
    for i in (i for i, req in enumerate(requests) if not _filtered(req.params)):
        tokens[i] = _pick_rows(probs[i : i + 1], [requests[i]])[0]  # the whole vocabulary, in its own order
    if filtered:
        rows: slice | list[int] = slice(None) if len(filtered) == len(requests) else filtered  # a slice copies nothing
        for i, token in zip(filtered, _sample_filtered(scaled[rows], probs[rows], [requests[i] for i in filtered]),
                            strict=True):  # fmt: skip
            tokens[i] = token
    return tokens


def _filtered(p: SamplingParams) -> bool:
    return p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0


def _sample_filtered(scaled: torch.Tensor, probs: torch.Tensor, requests: list[SampleRequest]) -> list[int]:
    """Tokens for rows with a filter (`scaled`: logits over temperature, `probs` their distribution), from
    each row's `CANDIDATES` most likely tokens where its filters stay within them, else as
    `_sample_past_candidates` draws. Every row's numbers are computed on that row alone, whatever the batch's
    other rows ask for."""
    params = [req.params for req in requests]
    width = min(scaled.shape[1], max(CANDIDATES, *(p.top_k for p in params)))
    values, order = kernels.top_k(scaled, width)  # each row's most likely tokens, most likely first
    count = min(width, CANDIDATES)
    top_k = torch.tensor([p.top_k if 0 < p.top_k <= count else count for p in params]).unsqueeze(1)
    # A top-k row's distribution renormalised over its k; another row's probabilities of its candidates.
    renormalised = torch.softmax(values[:, :count].masked_fill(torch.arange(count) >= top_k, -torch.inf), 1)
    with_k = torch.tensor([p.top_k > 0 for p in params]).unsqueeze(1)
    candidates = torch.where(with_k, renormalised, probs.gather(1, order[:, :count]))
    within = [0 < p.top_k <= count or (p.top_k == 0 and _cut_within(candidates[i], p)) for i, p in enumerate(params)]
    tokens = [0] * len(requests)
    rows = [i for i, inside in enumerate(within) if inside]
    if rows:
        kept = _apply_top_p_min_p(candidates[rows], [params[i] for i in rows])
        picks = _pick_rows(kept, [requests[i] for i in rows])
        for i, pick in zip(rows, picks, strict=True):
            tokens[i] = int(order[i, pick])
    for i in (i for i, inside in enumerate(within) if not inside):
        tokens[i] = _sample_past_candidates(scaled[i], probs[i], values[i], order[i], requests[i])
    return tokens


def _sample_past_candidates(row: torch.Tensor, probs: torch.Tensor, values: torch.Tensor, order: torch.Tensor,
                            req: SampleRequest) -> int:  # fmt: skip
    """A token of a row whose top-k holds more than the candidates (drawn over its k, all taken), or whose
    top-p or min-p may keep a token past them (drawn over its `WIDER` most likely tokens where the filters
    stay within those, else over the row sorted whole)."""
    p = req.params
    if p.top_k > 0:
        order, probs = order[: p.top_k], torch.softmax(values[: p.top_k], dim=-1)
    else:
        order = kernels.top_k(row.unsqueeze(0), min(WIDER, row.numel()))[1][0]
        if not _cut_within(probs[order], p):
            order = torch.sort(row, descending=True).indices
        probs = probs[order]
    kept = _apply_top_p_min_p(probs.unsqueeze(0), [p])
    return int(order[_pick_rows(kept, [req])[0]])


def _apply_top_p_min_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Rows of probabilities, most likely first, with top-p's and min-p's dropped tokens set to 0 (in place)."""
    top_p = torch.tensor([p.top_p if p.top_p < 1.0 else torch.inf for p in params], dtype=probs.dtype).unsqueeze(1)
    min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype).unsqueeze(1)
    # Drop a token when the tokens before it already reach top_p; the first always stays.
    before = torch.cumsum(probs, dim=1) - probs
    probs[before >= top_p] = 0.0
    probs[probs < min_p * probs[:, :1]] = 0.0
    return probs


def _pick_rows(probs: torch.Tensor, requests: list[SampleRequest]) -> list[int]:
    """An index of each row of `probs` (not all zero) drawn with probability probs[i] / the row's sum: one
    uniform draw from the row's request's generator against the row's running sum (in float64, so that even
    the last of 49,152 tokens keeps its own probability). A token of probability 0 never comes out: its
    running sum equals the one before."""
    cumulative = torch.cumsum(probs, dim=1, dtype=torch.float64)
    draws = torch.cat([torch.rand(1, generator=req.generator, dtype=torch.float64) for req in requests])
    points = (draws * cumulative[:, -1]).unsqueeze(1)
    picks = torch.searchsorted(cumulative, points, right=True).clamp_(max=probs.shape[1] - 1)
    return [int(i) for i in picks.squeeze(1).tolist()]


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
