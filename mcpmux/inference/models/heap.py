"""The heap a model load leaves, kept out of Python's full garbage collections.

Loading the first model imports torch and transformers: about 470,000 objects (functions, tuples,
dicts of their modules) that live as long as the process. CPython's cycle collector walks every one
of them in each full (oldest-generation) pass, which it starts whenever the objects that survived
into that generation have grown by a quarter: while serving, every few thousand requests. Each pass
holds the GIL for 210-320 ms on this 2-core host (measured in `benchmarks/engine.py`'s process: the
step thread stops, every request in flight waits, and a round's time to first token doubled).

So the first load ends by collecting what is garbage now and moving everything left into the
permanent generation (`gc.freeze`), which full passes skip: after it such a pass walks only what came
later. Objects that were frozen and die are still freed by reference counting; what leaks is only
frozen garbage held in reference cycles, such as that first model if the process later drops it
(one copy at most: later loads freeze nothing, as a model they froze could never be collected).
"""

from __future__ import annotations

import gc
import logging
import threading
import time

log = logging.getLogger(__name__)

_lock = threading.Lock()
_frozen = False


def freeze_after_first_load() -> None:
    """Collect, then freeze what is alive; only the first call in a process does anything."""
    global _frozen
    with _lock:
        if _frozen:
            return
        _frozen = True
        start = time.perf_counter()
        gc.collect()
        gc.freeze()
    log.debug("froze %d objects out of full collections in %.0f ms", gc.get_freeze_count(),
              (time.perf_counter() - start) * 1e3)  # fmt: skip
