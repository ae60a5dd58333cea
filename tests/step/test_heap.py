"""The loop's heap policy: frozen while an engine serves, handed back after the last one."""

from __future__ import annotations

import gc

from engine.step import heap


def test_the_heap_is_frozen_until_the_last_settled_engine_releases_it(monkeypatch):
    # Engines of other tests may still serve in this worker process: count from none.
    others = heap._settled
    monkeypatch.setattr(heap, "_settled", 0)
    gc.unfreeze()
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
        heap.settle()  # a second engine in the same process
        heap.release()
        assert gc.get_freeze_count() > 0, "one engine still serves"
        heap.release()
        assert gc.get_freeze_count() == 0
        heap.release()  # more releases than settles change nothing
        assert gc.get_freeze_count() == 0
    finally:
        while heap._settled:
            heap.release()
        if others:
            gc.freeze()  # as the other engines of this process had it
