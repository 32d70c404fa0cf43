"""Why an item was not served: each error names the queue, the limit and its value, and what to do.

Every refusal is a `RejectedError`; its class attribute `reason` ("queue_full", "deadline",
"closed") is the key under which the queue, gate or batcher counts it in its stats, so a
rejection is never silent.
"""

from __future__ import annotations

from typing import ClassVar


class BatchingError(Exception):
    """Base class of every error raised by `mcpmux.batching`."""


class RejectedError(BatchingError):
    """The item was not (or not fully) served; `reason` says why, `queue` says where."""

    reason: ClassVar[str] = "rejected"

    def __init__(self, message: str, *, queue: str) -> None:
        super().__init__(message)
        self.queue = queue


class QueueFullError(RejectedError):
    """The queue held `max_queue` items and its policy is `on_full="reject"`."""

    reason: ClassVar[str] = "queue_full"

    def __init__(self, queue: str, max_queue: int) -> None:
        super().__init__(
            f"queue {queue!r} is full (max_queue={max_queue}); retry later, raise max_queue, "
            "or set on_full='delay' to wait for room",
            queue=queue,
        )
        self.max_queue = max_queue


class DeadlineExceededError(RejectedError):
    """The item's deadline passed before it was answered; `stage` says where it was then."""

    reason: ClassVar[str] = "deadline"

    def __init__(self, queue: str, timeout: float | None, stage: str) -> None:
        limit = f"timeout={timeout:.3f}s" if timeout is not None else "its deadline"
        super().__init__(
            f"item in {queue!r} was not answered within {limit} (it was {stage}); "
            "give it a later deadline, lower the load, or raise its priority",
            queue=queue,
        )
        self.timeout = timeout
        self.stage = stage


class ClosedError(RejectedError):
    """The queue, gate or batcher was closed before the item was answered."""

    reason: ClassVar[str] = "closed"

    def __init__(self, queue: str, stage: str) -> None:
        super().__init__(
            f"{queue!r} was closed while the item was {stage}; it was not answered, submit it again to a running one",
            queue=queue,
        )
        self.stage = stage


class BatchResultError(BatchingError):
    """The batch function broke its contract: it must return one result per item, in order."""

    def __init__(self, queue: str, items: int, results: int) -> None:
        super().__init__(
            f"batch function of {queue!r} returned {results} results for {items} items; "
            "it must return a sequence of the same length, one result (or exception) per item, in order"
        )
        self.items = items
        self.results = results
