"""The Python heap as the step loop sees it: keeping full garbage collections short.

Owns one policy. A full (generation 2) collection walks every tracked object in the process:
torch, transformers and a loaded model make that hundreds of thousands of objects, and one
full collection on the loop thread then stops the engine for a visible pause (`python -m bench
step-cpu --gc` measures it; docs/benchmarks.md). `settle()`, once
the model is loaded and the graphs captured, collects once and moves everything alive into
the permanent generation (`gc.freeze()`), so later collections walk only what the engine
made since. Thresholds stay CPython's: a larger generation-0 threshold made the longest
pause longer, not shorter (same bench). Never collects on the hot path itself.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_settled = 0  # engines in this process that settled their heap and are not shut down


def settle() -> None:
    """After loading: collect, then freeze what is alive. Process-wide, as the heap is."""
    global _settled
    with _lock:
        gc.collect()
        gc.freeze()
        _settled += 1


def release() -> None:
    """At shutdown: when no settled engine is left, hand the frozen objects back to the
    collector, so what the engine held (a model's reference cycles) can be freed."""
    global _settled
    with _lock:
        if _settled == 0:
            return
        _settled -= 1
        if _settled == 0:
            gc.unfreeze()
