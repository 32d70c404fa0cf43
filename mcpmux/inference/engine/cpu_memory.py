"""Keep the memory a CPU step frees for the next step, instead of handing it back to the OS.

Every step allocates tensors of a few MB and frees them: the output head's float32 logits (6.3 MB at
32 rows of SmolLM2's 49,152 tokens), the sampler's scaled logits and probabilities. glibc serves an
allocation that large from its own `mmap` and gives it back to the OS on free (or trims the heap's
top), so the next step's tensor is fresh memory again and pays a page fault on every 4 KiB page it
first touches: the sampler's division and softmax over 32 such rows took 2.2-2.4 and 1.7 ms instead of
0.98-1.27 and 0.78-0.87 ms (docs/perf.md). `keep_freed_memory` raises glibc's mmap and trim
thresholds, so such blocks come from the heap and stay mapped for the next step: what vLLM's CPU
backend gets by preloading tcmalloc. The process keeps what it once used mapped (its peak, which the
KV cache and the weights dominate anyway).

Only where the C library is glibc (`mallopt`); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 * 2**20
"""Allocations below this come from the heap (glibc's own ceiling for its adaptive threshold is 32 MiB)."""
TRIM_THRESHOLD = 1 << 30
"""Free memory at the heap's top is given back to the OS only beyond this."""


def keep_freed_memory() -> bool:
    """Set glibc's thresholds as the module doc says; whether they were set."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        log.debug("no mallopt in this C library: freed memory goes back to the OS as it decides")
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
