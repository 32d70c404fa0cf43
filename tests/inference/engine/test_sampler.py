"""Sampling filters, per-request seeds, logprobs and parameter validation."""

from __future__ import annotations

import pytest
import torch

from mcpmux.inference.engine.config import SamplingParams
from mcpmux.inference.engine.sampler import CANDIDATES, WIDER, SampleRequest, make_generator, sample
from mcpmux.inference.errors import InvalidSettingError

CPU = torch.device("cpu")


def req(seed: int | None = 0, **params: object) -> SampleRequest:
    return SampleRequest(SamplingParams(seed=seed, **params), make_generator(seed, CPU))  # type: ignore[arg-type]


def draws(logits: torch.Tensor, n: int, **params: object) -> set[int]:
    r = req(seed=1, **params)
    return {sample(logits[None], [r]).token_ids[0] for _ in range(n)}


LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]))


def test_greedy_is_argmax() -> None:
    logits = torch.randn(3, 50)
    result = sample(logits, [req(temperature=0.0) for _ in range(3)])
    assert result.token_ids == logits.argmax(-1).tolist()


def test_greedy_rows_among_sampled_ones_take_their_own_argmax() -> None:
    torch.manual_seed(3)
    logits = torch.randn(4, 500) * 3
    mixed = [req(temperature=0.0), req(seed=7), req(temperature=0.0), req(seed=8, top_p=0.9)]
    tokens = sample(logits, mixed).token_ids
    assert [tokens[0], tokens[2]] == logits[[0, 2]].argmax(-1).tolist()
    assert tokens[1] == sample(logits[1:2], [req(seed=7)]).token_ids[0]
    assert tokens[3] == sample(logits[3:4], [req(seed=8, top_p=0.9)]).token_ids[0]


def test_top_k_top_p_min_p_restrict_the_support() -> None:
    assert draws(LOGITS, 300) == {0, 1, 2, 3, 4}
    assert draws(LOGITS, 200, top_k=2) == {0, 1}
    assert draws(LOGITS, 200, top_p=0.7) == {0, 1}  # 0.5 < 0.7, 0.5 + 0.25 reaches it
    assert draws(LOGITS, 200, min_p=0.4) == {0, 1}  # kept: p >= 0.4 * 0.5
    assert draws(LOGITS, 50, top_p=0.1) == {0}


def test_sampling_follows_the_distribution() -> None:
    r = req(seed=3)
    counts = torch.zeros(5)
    for _ in range(4000):
        counts[sample(LOGITS[None], [r]).token_ids[0]] += 1
    assert torch.allclose(counts / 4000, LOGITS.exp(), atol=0.03)


def test_seeded_rows_do_not_depend_on_their_neighbours() -> None:
    torch.manual_seed(0)
    rows = torch.randn(4, 40)
    alone = [sample(rows[i : i + 1], [req(seed=10 + i)]).token_ids[0] for i in range(4)]
    together = sample(rows, [req(seed=10 + i) for i in range(4)]).token_ids
    shuffled = sample(rows[[3, 1, 0, 2]], [req(seed=10 + i) for i in (3, 1, 0, 2)]).token_ids
    assert together == alone
    assert shuffled == [alone[i] for i in (3, 1, 0, 2)]


MIXED = [{}, {"top_k": 1000}, {"top_p": 0.9}, {"min_p": 0.02}, {"top_k": 20, "top_p": 0.5}, {"top_p": 0.999}]


def mixed_requests() -> list[SampleRequest]:
    return [req(seed=20 + i, **params) for i, params in enumerate(MIXED)]


def test_seeded_rows_at_vocabulary_size_do_not_depend_on_their_neighbours_filters() -> None:
    # Rows take their most likely tokens together, as wide as the batch's largest top-k: each row's draw
    # must still depend on that row alone, whichever path its filters take.
    torch.manual_seed(1)
    rows = torch.randn(len(MIXED), 3000) * 3
    alone = [sample(rows[i : i + 1], [mixed_requests()[i]]).token_ids[0] for i in range(len(MIXED))]
    together = sample(rows, mixed_requests()).token_ids
    backwards = sample(rows.flip(0), mixed_requests()[::-1]).token_ids
    assert together == alone
    assert backwards == alone[::-1]


@pytest.mark.parametrize(("size", "past"), [(4000, CANDIDATES), (49152, WIDER)])
def test_top_p_past_the_first_candidates_keeps_exactly_its_prefix(size: int, past: int) -> None:
    # A slowly falling distribution: top-p 0.5 keeps a prefix of about a quarter of the tokens, past the 256
    # looked at first (then past the WIDER next, sorted whole); no token after the prefix is ever drawn.
    logits = torch.linspace(0.0, -2.0, size)
    probs = torch.softmax(logits, dim=-1)
    kept = int(((torch.cumsum(probs, dim=-1) - probs) < 0.5).sum())
    assert kept > past
    r = req(seed=5, top_p=0.5)
    seen = {sample(logits[None], [r]).token_ids[0] for _ in range(600)}
    assert max(seen) < kept
    assert max(seen) >= past, "never drew past the first candidates"


def test_logprobs_report_the_sampled_token_and_top_n() -> None:
    result = sample(LOGITS[None], [req(temperature=0.0, logprobs=2)])
    lp = result.logprobs[0]
    assert lp is not None
    assert lp.token_id == 0
    assert lp.logprob == pytest.approx(float(torch.log(torch.tensor(0.5))), abs=1e-5)
    assert [t for t, _ in lp.top] == [0, 1]
    assert sample(LOGITS[None], [req(temperature=0.0)]).logprobs == [None]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"min_p": 2.0}, r"min_p must be in \[0, 1\]"),
        ({"top_k": -3}, "top_k must be >= 0"),
        ({"stop": [""]}, "stop strings must be non-empty"),
        ({"logprobs": 99}, "logprobs must be between 0 and 20"),
    ],
)
def test_invalid_sampling_params_say_what_to_fix(params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        SamplingParams(**params)  # type: ignore[arg-type]
