"""Paged attention: the transformers AttentionInterface glue (interface), the torch
reference (reference) and the Triton kernel (triton_paged).

The reference never depends on Triton; the kernel is tested against the reference.
"""
