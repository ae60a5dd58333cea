"""Pure-Python engine core: requests, the scheduler, the KV block allocator, flat-batch
assembly and incremental detokenization.

Everything here is plain Python and numpy, testable without a model or a device. It must
never import torch (tests/test_layering.py enforces it) and never decide device work.
"""
