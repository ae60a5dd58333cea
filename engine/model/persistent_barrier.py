"""The grid-wide barrier of the persistent decode layer (engine/model/persistent_layer.py).

Owns `grid_sync`, a @triton.jit device function: every program of a launch arrives on one
int32 counter in global memory and waits until all have arrived, so that what the programs
wrote before it (the q rows, the K/V cache rows, the attention output, the residual stream)
is visible to every program after it.

- Arrive: (FENCE 1, the default: every thread finishes its async copies and fences at GPU
  scope), `tl.debug_barrier()` (bar.sync: every thread of the program has issued its stores),
  then one atomic add with release semantics at GPU scope (a scalar atomic runs in one thread).
- Wait: spin on volatile loads (they go to L2, no atomic traffic on the counter while others
  arrive) until the counter reaches `target`, then one acquire atomic at GPU scope (the fence
  that makes the other programs' writes visible, L1 included) and bar.sync for the rest of
  the program's threads.

Replay safety inside a CUDA graph: the counter only grows within a step; the owner zeroes it
once per step, before the step's first persistent launch (`new_counter` / a memset node in the
graph), and barrier i of the step waits for (i + 1) * num_programs arrivals.

Deadlock: every program of the launch must be resident at once (grid <= SMs, one program per
SM fits: the launcher keeps the grid at most the SM count and nothing else runs on the stream).
Under TRITON_INTERPRET=1 programs run one after another, so the barrier is never compiled in
there: the launcher runs the phases as separate launches instead.
"""

from __future__ import annotations

import torch

from engine.attention.l2_prefetch import prefetch_lines
from engine.model.fused_ops import tl, triton

if triton is not None:
    MAX_SPINS = tl.constexpr(1 << 21)  # volatile L2 polls (~0.5 us each) before giving up

    @triton.jit
    def _fence_every_thread():
        """Every thread: its async copies done, then a sequentially consistent GPU-scope fence
        (membar.gl: the fence cooperative groups' grid sync uses). 128 elements: once a thread
        at 4 warps (a warp's fence covers its lanes' stores; more would only repeat it)."""
        tl.inline_asm_elementwise("cp.async.wait_all;\n\tfence.sc.gpu;\n\tmov.u32 $0, 0;",
                                  "=r,r", [tl.zeros([128], dtype=tl.int32)], dtype=tl.int32,
                                  is_pure=False, pack=1)

    @triton.jit
    def grid_sync(bar_ptr, target, FENCE: tl.constexpr = 0):
        """Arrive on the counter at bar_ptr[0], then wait until it reaches target. A wait
        longer than MAX_SPINS polls (about a second: the grid was not co-resident) gives up
        and raises the flag bar_ptr[1]; once it is up no barrier waits, so a broken launch
        ends with wrong results and a flag (`timed_out`) instead of hanging the GPU. FENCE 1:
        every thread also fences before arriving and after the wait, not only the thread that
        does the atomics; 2: only after the wait (an experiment, not yet run on a GPU). Without
        fences the H200 run of c9c481b/b3f9eb9 read stale data: gate_up's RMSNorm saw the hidden
        state as phase 0 had read it into the SM's L1, not as the o phase had written it (the
        one-launch layer differed only from SiLU*up on; with phases 2+3 alone in a launch, or one
        program, or FENCE 1 it was bit-equal: bench/results/2026-12-04-nvidia-h200-b3f9eb9).
        The acquire, which ptxas reduces to one L1 invalidate (CCTL.IVALL) by the thread that
        polls, evidently does not cover the other warps' reads."""
        if FENCE == 1:
            _fence_every_thread()
        tl.debug_barrier()
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        cur = tl.load(bar_ptr, volatile=True)
        ok = tl.load(bar_ptr + 1, volatile=True) == 0
        spins = 0
        while (cur < target) & (spins < MAX_SPINS) & ok:
            cur = tl.load(bar_ptr, volatile=True)
            spins += 1
        if spins >= MAX_SPINS:
            tl.atomic_xchg(bar_ptr + 1, 1)
        tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        if FENCE >= 1:
            _fence_every_thread()
        tl.debug_barrier()

    @triton.jit
    def prefetch_l2(base_ptr, nbytes, pid, progs, LINES: tl.constexpr):
        """Ask L2 for the bytes [0, nbytes) after base_ptr (weights of a later phase, which
        no phase writes), this program's share of them in 128-byte lines, LINES at a time;
        fire and forget (`prefetch.global.L2`: no register waits for it)."""
        lines = tl.cdiv(nbytes, 128)
        per = tl.cdiv(lines, progs)
        lo = pid * per
        hi = tl.minimum(lo + per, lines)
        base = base_ptr.to(tl.pointer_type(tl.int8))
        for first in range(lo, hi, LINES):
            idx = first + tl.arange(0, LINES)
            ptrs = base + tl.where(idx < hi, idx, lo).to(tl.int64) * 128
            prefetch_lines(ptrs)


def new_counter(device: torch.device) -> torch.Tensor:
    """A zeroed barrier counter: [0] the arrivals (zero it before each step's first launch,
    `counter[:1].zero_()`), [1] the timeout flag (never reset: see `timed_out`). One per model:
    steps never run concurrently."""
    return torch.zeros(2, dtype=torch.int32, device=device)


def timed_out(counter: torch.Tensor) -> bool:
    """Whether a barrier on this counter ever gave up waiting (a host sync: tests only)."""
    return bool(counter[1].item())
