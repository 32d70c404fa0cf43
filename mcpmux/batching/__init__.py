"""Generic batching and scheduling of items under a policy. Knows nothing of MCP or torch.

- `AgingQueue`: bounded priority queue with aging and deadlines (`QueuePolicy`).
- `AdmissionGate`: `async with gate.slot(priority=, deadline=)`: concurrency cap + token bucket (`GatePolicy`).
- `DynamicBatcher`: `await batcher.submit(item, priority=, deadline=)`; fixed or adaptive flushing (`BatchPolicy`).
- `SingleFlight`: identical concurrent keys share one call (run in its task, or by its first caller: `lead`).
- `ResultCache`: TTL + LRU result cache with scopes, tags and prefix invalidation (`CachePolicy`).
- `canonical_json` / `call_key`: equal JSON arguments give equal keys.

One clock: the queue, gate, batcher, flush rules and single-flight read time only through
`anyio.current_time()`, the running event loop's clock, and wait only through anyio (sleeps,
events, cancel scopes with deadlines); none of them calls `time.*` itself. Deadlines are absolute
times on that clock. Tests therefore take no clock argument: they run on a virtual-time event
loop (see tests/batching/virtual_time.py) and the whole layer follows it. The one exception is
`ResultCache`, which is synchronous and usable outside a loop: it reads its `clock=` argument,
default `time.monotonic` (the clock asyncio's loop itself reads), and tests pass one they advance.
"""

from mcpmux.batching.batcher import BatcherStats, BatchFn, DynamicBatcher
from mcpmux.batching.cache import CacheKey, CachePolicy, CacheStats, ResultCache
from mcpmux.batching.coalesce import Lead, SingleFlight, SingleFlightStats
from mcpmux.batching.errors import (
    BatchingError,
    BatchResultError,
    ClosedError,
    DeadlineExceededError,
    QueueFullError,
    RejectedError,
)
from mcpmux.batching.flush import CostModel, FlushDecision, RecentArrivals, decide_adaptive, decide_fixed
from mcpmux.batching.gate import AdmissionGate, GateStats, Held
from mcpmux.batching.keys import call_key, canonical_json
from mcpmux.batching.policy import BatchPolicy, GatePolicy, QueuePolicy, deadline_in
from mcpmux.batching.queue import AgingQueue, EntryState, QueueEntry

__all__ = [
    "AdmissionGate",
    "AgingQueue",
    "BatchFn",
    "BatchPolicy",
    "BatchResultError",
    "BatcherStats",
    "BatchingError",
    "CacheKey",
    "CachePolicy",
    "CacheStats",
    "ClosedError",
    "CostModel",
    "DeadlineExceededError",
    "DynamicBatcher",
    "EntryState",
    "FlushDecision",
    "GatePolicy",
    "GateStats",
    "Held",
    "Lead",
    "QueueEntry",
    "QueueFullError",
    "QueuePolicy",
    "RecentArrivals",
    "RejectedError",
    "ResultCache",
    "SingleFlight",
    "SingleFlightStats",
    "call_key",
    "canonical_json",
    "deadline_in",
    "decide_adaptive",
    "decide_fixed",
]
