"""Adaptive batching: the online cost model, the wait-only-while-it-pays rule, and both end to end."""

from __future__ import annotations

import random

import anyio
import pytest

from mcpmux.batching import BatchPolicy, CostModel, DynamicBatcher, RecentArrivals, decide_adaptive


def test_cost_model_recovers_a_known_linear_cost() -> None:
    model = CostModel(window=50)
    for n in [1, 4, 9, 16, 2, 30, 7]:
        model.observe(n, 0.020 + 0.001 * n)
    assert model.a == pytest.approx(0.001, rel=1e-6)
    assert model.b == pytest.approx(0.020, rel=1e-6)
    assert model.predict(10) == pytest.approx(0.030, rel=1e-6)


def test_cost_model_forgets_batches_older_than_its_window() -> None:
    model = CostModel(window=5)
    for n in range(1, 6):
        model.observe(n, 1.0 + n)  # an old regime
    for n in range(1, 6):
        model.observe(n, 0.010 + 0.002 * n)  # the upstream got faster
    assert (model.a, model.b) == (pytest.approx(0.002), pytest.approx(0.010))


def test_cost_model_with_one_size_or_noise_stays_non_negative() -> None:
    model = CostModel()
    model.observe(4, 0.03)
    model.observe(4, 0.05)
    assert (model.a, model.b) == (0.0, pytest.approx(0.04))  # cannot tell a from b: all fixed
    falling = CostModel()
    for n, t in [(1, 0.05), (10, 0.01)]:
        falling.observe(n, t)
    assert falling.a == 0.0
    assert falling.b == pytest.approx(0.03)


def fitted(a: float, b: float) -> CostModel:
    model = CostModel()
    model.observe(1, a + b)
    model.observe(11, 11 * a + b)
    return model


def arrivals(count: int, horizon: float, now: float) -> RecentArrivals:
    recent = RecentArrivals(horizon=horizon)
    for k in range(count):
        recent.record(now - horizon * k / (count + 1))
    return recent


def test_an_arrival_still_counted_leaves_the_window_strictly_later() -> None:
    """`changes_in` is what the batcher waits for; 0 s while the arrival still counts would spin.

    These figures came from a load run: ``t <= now - horizon`` kept the arrival, ``t + horizon - now``
    said it had left already.
    """
    recent = RecentArrivals(horizon=0.020000000000000004)
    recent.record(0.1310250353935498)
    now = 0.15102503539354978
    drops_in = recent.changes_in(now)
    assert recent.count(now) == 0 or (drops_in is not None and drops_in > 0)


def test_adaptive_rule_sends_at_once_without_a_model_or_under_light_load() -> None:
    policy = BatchPolicy(mode="adaptive", max_batch_size=32, max_delay=0.05)
    assert decide_adaptive(3, 0.0, policy, CostModel(), RecentArrivals(), now=10.0).take == 3
    # One arrival during the last fixed cost b: waiting costs 3 items more than it could save.
    assert decide_adaptive(3, 0.0, policy, fitted(0.001, 0.02), arrivals(1, 0.02, 10.0), now=10.0).take == 3


def test_adaptive_rule_waits_while_arrivals_outnumber_the_waiting_items() -> None:
    policy = BatchPolicy(mode="adaptive", max_batch_size=32, max_delay=0.05, max_latency=1.0)
    decision = decide_adaptive(3, 0.001, policy, fitted(0.001, 0.02), arrivals(10, 0.02, 10.0), now=10.0)
    assert decision.take == 0
    assert decision.recheck_in is not None
    assert 0 < decision.recheck_in <= 0.049
    # ... but never past max_delay, the latency budget, or max_batch_size.
    assert decide_adaptive(3, 0.05, policy, fitted(0.001, 0.02), arrivals(10, 0.02, 10.0), now=10.0).take == 3
    tight = BatchPolicy(mode="adaptive", max_batch_size=32, max_delay=0.05, max_latency=0.025)
    assert decide_adaptive(3, 0.001, tight, fitted(0.001, 0.02), arrivals(10, 0.02, 10.0), now=10.0).take == 3
    assert decide_adaptive(40, 0.0, policy, fitted(0.001, 0.02), arrivals(50, 0.02, 10.0), now=10.0).take == 32


async def run_load(
    policy: BatchPolicy, clients: int, per_client: int, think: float = 0.0
) -> tuple[DynamicBatcher[int, int], float]:
    """Closed-loop clients (pausing up to `think` s) on an upstream costing 20 ms + 1 ms per item."""

    async def upstream(items: list[int]) -> list[int]:
        await anyio.sleep(0.020 + 0.001 * len(items))
        return items

    latencies: list[float] = []
    async with DynamicBatcher(upstream, policy) as batcher:

        async def client(seed: int) -> None:
            rng = random.Random(seed)
            for k in range(per_client):
                await anyio.sleep(rng.uniform(0, think))
                start = anyio.current_time()
                assert await batcher.submit(k) == k
                latencies.append(anyio.current_time() - start)

        async with anyio.create_task_group() as tg:
            for seed in range(clients):
                tg.start_soon(client, seed)
    return batcher, sum(latencies) / len(latencies)


@pytest.mark.anyio
async def test_adaptive_batcher_learns_the_synthetic_cost_and_batches_under_load() -> None:
    policy = BatchPolicy(mode="adaptive", max_batch_size=32, max_delay=0.01, max_concurrent_batches=2)
    # Random pauses make batch sizes vary, which is what lets the fit tell `a` from `b`.
    batcher, _ = await run_load(policy, clients=24, per_client=8, think=0.03)
    stats = batcher.stats()
    assert stats.items == 24 * 8
    assert stats.mean_batch_size >= 4
    # On virtual time (conftest.py) each batch takes exactly 20 ms + 1 ms per item: the fit finds both.
    assert stats.cost_per_item == pytest.approx(0.001, rel=1e-9)
    assert stats.cost_fixed == pytest.approx(0.020, rel=1e-9)


@pytest.mark.anyio
async def test_adaptive_batcher_does_not_hold_a_lone_caller_back() -> None:
    fixed = BatchPolicy(mode="fixed", max_batch_size=32, max_delay=0.04)
    adaptive = BatchPolicy(mode="adaptive", max_batch_size=32, max_delay=0.04)
    _, fixed_latency = await run_load(fixed, clients=1, per_client=6)
    _, adaptive_latency = await run_load(adaptive, clients=1, per_client=6)
    assert fixed_latency == pytest.approx(0.040 + 0.021, rel=1e-9)  # the whole 40 ms window, then the 21 ms call
    assert adaptive_latency == pytest.approx(0.021, rel=1e-9)  # the call alone: never held back


def test_adaptive_rule_spreads_over_free_slots_and_waits_only_on_the_last_one() -> None:
    policy = BatchPolicy(mode="adaptive", max_batch_size=32, max_delay=0.05, max_concurrent_batches=4)
    busy = arrivals(40, 0.02, 10.0)
    assert decide_adaptive(64, 0.0, policy, fitted(0.001, 0.02), busy, now=10.0, free_slots=4).take == 16
    assert decide_adaptive(10, 0.0, policy, fitted(0.001, 0.02), busy, now=10.0, free_slots=3).take == 4
    # Spare slots: nothing is saved by waiting, so even one item goes at once.
    assert decide_adaptive(1, 0.0, policy, fitted(0.001, 0.02), busy, now=10.0, free_slots=2).take == 1
    assert decide_adaptive(1, 0.0, policy, fitted(0.001, 0.02), busy, now=10.0, free_slots=1).take == 0
