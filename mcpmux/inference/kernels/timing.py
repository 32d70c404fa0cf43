"""Timing ways of doing the same work against each other, to choose one at run time (`cpu_fused`'s float32
prefill rows, `models.linear`'s layouts and default dtype)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def best_seconds(ways: Mapping[K, Callable[[], object]], rounds: int) -> dict[K, float]:
    """Each way's fastest run over `rounds` rounds in which the ways take turns: interleaved, so that all see the
    same load, and the fastest of each, as other work on the host only adds time."""
    seconds = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for key, way in ways.items():
            start = time.perf_counter()
            way()
            seconds[key] = min(seconds[key], time.perf_counter() - start)
    return seconds
