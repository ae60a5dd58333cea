"""How the fused kernels launch under programmatic dependent launch (config keys fused_pdl,
pdl_overlap): whether PDL is available, when the next kernel may launch, and how many
weight bytes a kernel asks L2 for before it waits on the previous one.

Owns `pdl_launch`, the (USE_GDC, PF_K, launch options) a fused kernel is launched with
(engine/model/fused_gemm.py's `_mainloop` says what the kernel does with them), and the byte
bound of the weight prefetch. Pure host code: it never launches a kernel.
"""

from __future__ import annotations

import torch

from engine.attention.triton_config import pdl_available
from engine.config import PDL_OVERLAPS

# USE_GDC per pdl_overlap value (engine.config owns the values).
PDL_OVERLAP_LEVELS = {"late": 1, "early": 2, "prefetch": 2}
assert tuple(PDL_OVERLAP_LEVELS) == PDL_OVERLAPS
PREFETCH_BUDGET = 8 << 20  # bytes of weights a PDL launch asks L2 for before its wait


def prefetch_k(rows: int, k: int, elem_size: int) -> int:
    """Columns of each of `rows` weight rows (K = k) to ask L2 for before the PDL wait: all of
    them while the whole weight is <= PREFETCH_BUDGET, else as many whole 128-byte lines as
    the budget allows (0: none). A kernel's prefetch is issued while the previous kernel runs;
    more than a fraction of L2 would evict lines before they are read."""
    if rows * k * elem_size <= PREFETCH_BUDGET:
        return k
    line = 128 // elem_size
    return PREFETCH_BUDGET // (rows * elem_size) // line * line


def pdl_launch(pdl: bool, overlap: str, x: torch.Tensor, rows: int, k: int,
               elem_size: int) -> tuple[int, int, dict]:
    """(USE_GDC, PF_K, launch options) of a fused kernel: USE_GDC 0 without PDL (asked for
    and supported here), 1 for overlap "late" (the next kernel launches after the K loop), 2
    for "early" and "prefetch" (right after the wait); PF_K > 0 only for "prefetch"."""
    if not (pdl and x.is_cuda and pdl_available(x.device)):
        return 0, 0, {}
    if overlap not in PDL_OVERLAP_LEVELS:
        raise ValueError(f"pdl_overlap must be one of {', '.join(map(repr, PDL_OVERLAPS))}, "
                         f"got {overlap!r}")
    pf = prefetch_k(rows, k, elem_size) if overlap == "prefetch" else 0
    return PDL_OVERLAP_LEVELS[overlap], pf, {"launch_pdl": True}
