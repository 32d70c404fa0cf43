"""A step's few-MB tensors reuse the memory the last step freed instead of faulting fresh pages in."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A sampled step's large temporaries (the head's logits at 32 rows of 49,152 tokens, over temperature, then
# their probabilities): three steps, then the minor page faults of ten more. With glibc's own thresholds the
# ten fault about 30,000 pages (two tensors' 1,536 each, every step) in 11 runs of 12 here.
STEP_FAULTS = """
import resource, sys, torch
from mcpmux.inference.engine.cpu_memory import keep_freed_memory
assert keep_freed_memory()
def step():
    logits = torch.ones(32, 49152)
    return torch.softmax(logits / 0.7, dim=1).sum()
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_step_tensors_stay_mapped_for_the_next_step() -> None:
    done = subprocess.run([sys.executable, "-c", STEP_FAULTS], capture_output=True, text=True, check=True)
    pages = 32 * 49152 * 4 // 4096  # of one such tensor
    assert int(done.stdout.split()[-1]) < 4 * pages  # the heap growing once or twice, not every step
