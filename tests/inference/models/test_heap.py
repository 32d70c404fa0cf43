"""The first model load keeps the process's long-lived heap (torch's and transformers' modules) out of
full garbage collections, each of which otherwise stops every thread for a quarter of a second; later
loads freeze nothing, so a model dropped later is still collected. Real loads, in a fresh process (the
freeze is once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import gc, json, sys, weakref
from mcpmux.inference.models.loader import load_model
before = gc.get_freeze_count()
first = load_model(sys.argv[1], device="cpu")
frozen = gc.get_freeze_count()
gc.collect()
oldest = len(gc.get_objects(generation=2))
second = load_model(sys.argv[1], device="cpu")
again = gc.get_freeze_count()
gone = weakref.ref(second.model)
del second
gc.collect()
print(json.dumps({"before": before, "frozen": frozen, "oldest": oldest, "again": again,
                  "second_collected": gone() is None}))
"""


def test_first_load_freezes_the_heap_and_later_loads_stay_collectable(tiny_llama: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(tiny_llama)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["before"] == 0
    assert seen["frozen"] > 100_000  # torch and transformers alone are some 360,000 objects
    assert seen["oldest"] < seen["frozen"] / 10  # what a full collection still walks
    assert seen["again"] <= seen["frozen"]  # nothing more frozen (frozen objects that died have left it)
    assert seen["second_collected"]
